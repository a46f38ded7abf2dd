//! A byte holding one defined flag bit, the others reserved.
//!
//! Several headers carry such a byte (a log region's valid bit, an RPC packet's response
//! bit). Written by hand rather than with `bitflags` because the type must also be a
//! zerocopy `#[repr(C)]` byte whose undefined bits are refused when parsed, which
//! `bitflags`' generated types do not give.

/// Defines `$name`, a `#[repr(C)]` byte whose bit 0 is a flag and whose other bits must be
/// zero: constants for the flag clear and set, a checked `from_raw`, `to_raw`, a getter, a
/// `with_*` setter, and a `Debug` that names the flag.
macro_rules! one_bit_flag_byte {
    (
        $(#[$meta:meta])*
        pub struct $name:ident;
        field = $field:literal;
        flag = $flag:literal;
        $(#[$clear_doc:meta])* clear = $clear:ident;
        $(#[$set_doc:meta])* set = $set:ident;
        $(#[$get_doc:meta])* get = $get:ident;
        $(#[$with_doc:meta])* with = $with:ident;
    ) => {
        $(#[$meta])*
        #[derive(
            Clone,
            Copy,
            PartialEq,
            Eq,
            Hash,
            Default,
            zerocopy::FromBytes,
            zerocopy::IntoBytes,
            zerocopy::KnownLayout,
            zerocopy::Immutable,
            zerocopy::Unaligned,
        )]
        #[repr(C)]
        pub struct $name(u8);

        static_assertions::assert_eq_size!($name, u8);

        impl $name {
            const BIT: u8 = 1;
            $(#[$clear_doc])*
            pub const $clear: Self = Self(0);
            $(#[$set_doc])*
            pub const $set: Self = Self(Self::BIT);

            /// Parses a raw byte, refusing undefined bits.
            pub const fn from_raw(raw: u8) -> Result<Self, $crate::LayoutError> {
                if raw & !Self::BIT != 0 {
                    return Err($crate::LayoutError::InvalidField { field: $field });
                }
                Ok(Self(raw))
            }

            /// The raw byte.
            pub const fn to_raw(self) -> u8 {
                self.0
            }

            $(#[$get_doc])*
            pub const fn $get(self) -> bool {
                self.0 & Self::BIT != 0
            }

            $(#[$with_doc])*
            pub const fn $with(self, on: bool) -> Self {
                Self(if on { self.0 | Self::BIT } else { self.0 & !Self::BIT })
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field($flag, &self.$get())
                    .finish()
            }
        }
    };
}

pub(crate) use one_bit_flag_byte;
