//! The error every checked constructor in this crate returns.

/// Why a byte image was refused.
///
/// Each variant names what was wrong so that a caller can log it in one line; none of them
/// carries the bytes, so an error is cheap to return from a hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The buffer is shorter than the layout needs.
    #[error("buffer too short: need {needed} bytes, got {got}")]
    TooShort {
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes the buffer has.
        got: usize,
    },
    /// The buffer is longer than the layout allows.
    #[error("buffer too long: at most {max} bytes, got {got}")]
    TooLong {
        /// Most bytes the layout allows.
        max: usize,
        /// Bytes the buffer has.
        got: usize,
    },
    /// The buffer is not aligned as the layout needs.
    #[error("buffer misaligned: need {align}-byte alignment")]
    Misaligned {
        /// Alignment the layout needs.
        align: usize,
    },
    /// A field holds a value the layout does not define.
    #[error("invalid value in field `{field}`")]
    InvalidField {
        /// Name of the field.
        field: &'static str,
    },
    /// A value does not fit the field meant to hold it (a key too large for a slot, a
    /// counter that would overflow, a message that would overflow its frame).
    #[error("`{field}` does not fit: {value} exceeds {max}")]
    DoesNotFit {
        /// Name of the field.
        field: &'static str,
        /// The value offered.
        value: u64,
        /// The most the field holds.
        max: u64,
    },
}
