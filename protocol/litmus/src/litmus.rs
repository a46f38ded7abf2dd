//! The litmus tests of Pandora §5 (Fig. 5): their keys, initial states, transactions and
//! application-level assertions.
//!
//! Each litmus has two transactions (roles). A run holds a few *instances* of one litmus,
//! each on its own keys (X, Y, Z of instance `i` are keys `8i + 1`, `8i + 2`, `8i + 3` of
//! [`TABLE`]). The transactions are written once against [`dmem_txn::Transaction`], so
//! every protocol runs the same code; the only protocol-visible freedom is the seeded
//! [`Shape`] of an attempt (operation order, locking read or plain read, blind write,
//! delays between operations), which is how a run explores interleavings.

use core::fmt;

use dmem_txn::{Key, TableId, Transaction, TxnError};
use dmem_verbs::{Clock, Nanos};

use crate::LitmusError;
use crate::rng::SplitMix;

/// The table every litmus uses: 8-byte little-endian `u64` values.
pub const TABLE: TableId = TableId(1);

/// Bytes of a litmus value.
pub const VALUE_LEN: usize = 8;

/// One of Pandora's litmus tests (§5.1, Fig. 5) or a variant of litmus 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Litmus {
    /// Litmus 1, *direct-write cycles* (Fig. 5(a)): T1 writes V1 to X and Y, T2 writes V2
    /// to X and Y. Assertion (Fig. 5(d)): X = Y.
    DirectWrite,
    /// Litmus 1 with inserts: X and Y start absent; each transaction inserts its value
    /// into an absent key and updates a present one. Assertion: X and Y are both absent,
    /// or both present and equal.
    DirectWriteInsert,
    /// Litmus 1 with deletes: X = Y = 0; T1 deletes both, T2 writes (or re-inserts) V2 into
    /// both. Assertion: both absent, or both present and equal.
    DirectWriteDelete,
    /// Litmus 2, *read-write cycles* (Fig. 5(b)): X = Y = 0; T1 reads X and writes
    /// Y := X + 1, T2 reads Y and writes X := Y + 1. "If T1 reads X = 0 then T2 must read
    /// Y = 1": the only final states of a serial order are (0,0), (0,1), (1,0), (2,1),
    /// (1,2); (1,1) is the write skew.
    ReadWrite,
    /// Litmus 3, *indirect-write cycles* (Fig. 5(c)): X = Y = Z = 0; T1 increments X and
    /// writes the new X into Y, T2 increments X and writes it into Z. Assertion: Y ≤ X and
    /// Z ≤ X.
    IndirectWrite,
}

impl Litmus {
    /// Every litmus, in Table 1 order (1, its variants, 2, 3).
    pub const ALL: [Litmus; 5] = [
        Litmus::DirectWrite,
        Litmus::DirectWriteInsert,
        Litmus::DirectWriteDelete,
        Litmus::ReadWrite,
        Litmus::IndirectWrite,
    ];

    /// The name used on the command line: `1`, `1-insert`, `1-delete`, `2`, `3`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Litmus::DirectWrite => "1",
            Litmus::DirectWriteInsert => "1-insert",
            Litmus::DirectWriteDelete => "1-delete",
            Litmus::ReadWrite => "2",
            Litmus::IndirectWrite => "3",
        }
    }

    /// What the litmus checks, in Pandora's words.
    #[must_use]
    pub const fn title(self) -> &'static str {
        match self {
            Litmus::DirectWrite => "direct-write cycles",
            Litmus::DirectWriteInsert => "direct-write cycles, inserts",
            Litmus::DirectWriteDelete => "direct-write cycles, deletes",
            Litmus::ReadWrite => "read-write cycles",
            Litmus::IndirectWrite => "indirect-write cycles",
        }
    }

    /// Parses a comma-separated list of litmus names, or `all`.
    ///
    /// # Errors
    /// [`LitmusError::UnknownLitmus`] for a name that is not a litmus; an empty list is
    /// refused the same way.
    pub fn parse_list(list: &str) -> Result<Vec<Litmus>, LitmusError> {
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if name == "all" {
                for l in Litmus::ALL {
                    if !out.contains(&l) {
                        out.push(l);
                    }
                }
                continue;
            }
            let l = name.parse()?;
            if !out.contains(&l) {
                out.push(l);
            }
        }
        if out.is_empty() {
            return Err(LitmusError::UnknownLitmus(list.to_owned()));
        }
        Ok(out)
    }

    /// Number of keys per instance (X, Y and for litmus 3 Z).
    #[must_use]
    pub const fn key_count(self) -> usize {
        match self {
            Litmus::IndirectWrite => 3,
            _ => 2,
        }
    }

    /// The initial value of each key of an instance (`None`: absent).
    #[must_use]
    pub fn initial(self) -> Vec<Option<u64>> {
        match self {
            Litmus::DirectWriteInsert => vec![None, None],
            _ => vec![Some(0); self.key_count()],
        }
    }

    /// [`assert_final`](Self::assert_final) for a protocol promising `isolation`: under
    /// snapshot isolation litmus 2's write skew (X = Y = 1) is an allowed outcome, the other
    /// assertions are the same (their violations are G0, G1 or G-single cycles).
    ///
    /// # Errors
    /// A [`String`] saying which assertion failed, with the values.
    pub fn assert_final_under(
        self,
        state: &[Option<u64>],
        isolation: dmem_txn::Isolation,
    ) -> Result<(), String> {
        let skew = state.first().copied().flatten() == Some(1)
            && state.get(1).copied().flatten() == Some(1);
        if self == Litmus::ReadWrite && isolation == dmem_txn::Isolation::Snapshot && skew {
            return Ok(());
        }
        self.assert_final(state)
    }

    /// Checks the application-level assertion of Pandora Fig. 5 on the final values of one
    /// instance's keys (X, Y[, Z]); `Err` carries a one-line reason.
    ///
    /// # Errors
    /// A [`String`] saying which assertion failed, with the values.
    pub fn assert_final(self, state: &[Option<u64>]) -> Result<(), String> {
        let show = |v: Option<u64>| v.map_or_else(|| "absent".to_owned(), |v| v.to_string());
        let get = |i: usize| state.get(i).copied().flatten();
        let (x, y, z) = (get(0), get(1), get(2));
        match self {
            Litmus::DirectWrite => match (x, y) {
                (Some(x), Some(y)) if x == y => Ok(()),
                _ => Err(format!(
                    "X={} Y={}: Fig. 5(a) asserts X = Y",
                    show(x),
                    show(y)
                )),
            },
            Litmus::DirectWriteInsert | Litmus::DirectWriteDelete => {
                if x == y {
                    Ok(())
                } else {
                    Err(format!(
                        "X={} Y={}: both absent or both present and equal",
                        show(x),
                        show(y)
                    ))
                }
            }
            Litmus::ReadWrite => match (x, y) {
                (Some(0), Some(0))
                | (Some(0), Some(1))
                | (Some(1), Some(0))
                | (Some(2), Some(1))
                | (Some(1), Some(2)) => Ok(()),
                _ => Err(format!(
                    "X={} Y={}: no serial order of T1 (Y := X + 1) and T2 (X := Y + 1) ends so{}",
                    show(x),
                    show(y),
                    if (x, y) == (Some(1), Some(1)) {
                        " (write skew: each read the other's key before its write)"
                    } else {
                        ""
                    }
                )),
            },
            Litmus::IndirectWrite => match (x, y, z) {
                (Some(x), Some(y), Some(z)) if y <= x && z <= x => Ok(()),
                _ => Err(format!(
                    "X={} Y={} Z={}: Fig. 5(c) asserts Y <= X and Z <= X",
                    show(x),
                    show(y),
                    show(z)
                )),
            },
        }
    }
}

impl fmt::Display for Litmus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for Litmus {
    type Err = LitmusError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Litmus::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| LitmusError::UnknownLitmus(s.to_owned()))
    }
}

/// The keys of one instance: X, Y, Z.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceKeys {
    /// X.
    pub x: Key,
    /// Y.
    pub y: Key,
    /// Z (litmus 3 only).
    pub z: Key,
}

impl InstanceKeys {
    /// The keys of instance `i`.
    #[must_use]
    pub const fn of(i: u16) -> Self {
        let base = 8 * i as u64 + 1;
        Self {
            x: Key(base),
            y: Key(base + 1),
            z: Key(base + 2),
        }
    }

    /// The first `n` of X, Y, Z.
    #[must_use]
    pub fn first(&self, n: usize) -> Vec<Key> {
        [self.x, self.y, self.z].into_iter().take(n).collect()
    }
}

/// The seeded choices of one attempt of a litmus transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Litmus 1: write Y before X. Litmus 2/3: lock the written (private) key with
    /// `read_for_update` before the read.
    pub swap: bool,
    /// Read with `read_for_update` (lock now) instead of a plain `read` / blind write.
    pub lock_read: bool,
    /// Lock the written key with `read_for_update` before writing it (no blind write).
    pub lock_write: bool,
    /// Delays before each of up to four operations.
    pub gaps: [Nanos; 4],
}

impl Shape {
    /// Draws a shape with gaps below `max_gap`.
    #[must_use]
    pub fn draw(rng: &mut SplitMix, max_gap: Nanos) -> Self {
        let bits = rng.next_u64();
        let mut gaps = [0; 4];
        for g in &mut gaps {
            *g = rng.below(max_gap.max(1));
        }
        Self {
            swap: bits & 1 != 0,
            lock_read: bits & 2 != 0,
            lock_write: bits & 4 != 0,
            gaps,
        }
    }
}

fn decode(v: Option<Vec<u8>>, key: Key) -> Result<Option<u64>, TxnError> {
    match v {
        None => Ok(None),
        Some(bytes) => {
            let arr: [u8; VALUE_LEN] = bytes
                .get(..VALUE_LEN)
                .and_then(|b| b.try_into().ok())
                .ok_or(TxnError::KeyState(key.0))?;
            Ok(Some(u64::from_le_bytes(arr)))
        }
    }
}

fn present(v: Option<u64>, key: Key) -> Result<u64, TxnError> {
    v.ok_or(TxnError::KeyState(key.0))
}

async fn pause<K: Clock>(clock: &K, gap: Nanos) {
    if gap > 0 {
        clock.sleep(gap).await;
    }
}

/// Writes `value` into `key`, inserting it if the transaction found it absent.
async fn upsert<T: Transaction>(t: &mut T, key: Key, value: u64) -> Result<(), TxnError> {
    let seen = decode(t.read_for_update(TABLE, key).await?, key)?;
    if seen.is_some() {
        t.write(TABLE, key, &value.to_le_bytes()).await
    } else {
        t.insert(TABLE, key, &value.to_le_bytes()).await
    }
}

/// The operations of role `role` (0 = T1, 1 = T2) of `litmus` on instance `keys`, in the
/// order and with the delays of `shape`, up to (not including) commit.
///
/// # Errors
/// Whatever the protocol returns; the caller aborts the transaction.
pub async fn body<T: Transaction, K: Clock>(
    litmus: Litmus,
    role: usize,
    keys: InstanceKeys,
    shape: Shape,
    t: &mut T,
    clock: &K,
) -> Result<(), TxnError> {
    match litmus {
        Litmus::DirectWrite | Litmus::DirectWriteInsert | Litmus::DirectWriteDelete => {
            direct_write(litmus, role, keys, shape, t, clock).await
        }
        Litmus::ReadWrite => read_write(role, keys, shape, t, clock).await,
        Litmus::IndirectWrite => indirect_write(role, keys, shape, t, clock).await,
    }
}

/// Reads `key` for update and requires it present.
async fn locked_present<T: Transaction>(t: &mut T, key: Key) -> Result<u64, TxnError> {
    present(decode(t.read_for_update(TABLE, key).await?, key)?, key)
}

/// Litmus 1 and its insert and delete forms: both roles write x and y (in an order the
/// shape may swap).
async fn direct_write<T: Transaction, K: Clock>(
    litmus: Litmus,
    role: usize,
    keys: InstanceKeys,
    shape: Shape,
    t: &mut T,
    clock: &K,
) -> Result<(), TxnError> {
    let value = role as u64 + 1;
    let order = if shape.swap {
        [keys.y, keys.x]
    } else {
        [keys.x, keys.y]
    };
    for (i, key) in order.into_iter().enumerate() {
        pause(clock, shape.gaps[i]).await;
        match litmus {
            Litmus::DirectWriteInsert => upsert(t, key, value).await?,
            Litmus::DirectWriteDelete if role == 0 => {
                let seen = decode(t.read_for_update(TABLE, key).await?, key)?;
                if seen.is_some() {
                    t.delete(TABLE, key).await?;
                }
            }
            Litmus::DirectWriteDelete => upsert(t, key, value).await?,
            _ => {
                let lock = if i == 0 {
                    shape.lock_read
                } else {
                    shape.lock_write
                };
                if lock {
                    locked_present(t, key).await?;
                }
                t.write(TABLE, key, &value.to_le_bytes()).await?;
            }
        }
    }
    Ok(())
}

/// Litmus 2: each role reads one key and writes the other one past what it read.
async fn read_write<T: Transaction, K: Clock>(
    role: usize,
    keys: InstanceKeys,
    shape: Shape,
    t: &mut T,
    clock: &K,
) -> Result<(), TxnError> {
    let g = shape.gaps;
    let (read, written) = if role == 0 {
        (keys.x, keys.y)
    } else {
        (keys.y, keys.x)
    };
    if shape.swap && shape.lock_write {
        pause(clock, g[0]).await;
        locked_present(t, written).await?;
    }
    pause(clock, g[1]).await;
    let seen = present(decode(t.read(TABLE, read).await?, read)?, read)?;
    pause(clock, g[2]).await;
    if !shape.swap && shape.lock_write {
        locked_present(t, written).await?;
    }
    t.write(TABLE, written, &(seen + 1).to_le_bytes()).await
}

/// Litmus 3: each role increments x and copies it into its private key.
async fn indirect_write<T: Transaction, K: Clock>(
    role: usize,
    keys: InstanceKeys,
    shape: Shape,
    t: &mut T,
    clock: &K,
) -> Result<(), TxnError> {
    let g = shape.gaps;
    let private = if role == 0 { keys.y } else { keys.z };
    if shape.swap {
        pause(clock, g[0]).await;
        locked_present(t, private).await?;
    }
    pause(clock, g[1]).await;
    let raw = if shape.lock_read {
        t.read_for_update(TABLE, keys.x).await?
    } else {
        t.read(TABLE, keys.x).await?
    };
    let x = present(decode(raw, keys.x)?, keys.x)? + 1;
    pause(clock, g[2]).await;
    t.write(TABLE, keys.x, &x.to_le_bytes()).await?;
    pause(clock, g[3]).await;
    if !shape.swap && shape.lock_write {
        locked_present(t, private).await?;
    }
    t.write(TABLE, private, &x.to_le_bytes()).await
}

/// Reads the keys of every instance in one read-only transaction (Pandora §5: "we use
/// special read-only transactions for realizing the assertions").
///
/// # Errors
/// Whatever the protocol returns; the caller aborts and retries.
pub async fn read_all<T: Transaction>(
    t: &mut T,
    keys: &[Key],
) -> Result<Vec<Option<u64>>, TxnError> {
    let mut out = Vec::with_capacity(keys.len());
    for &key in keys {
        out.push(decode(t.read(TABLE, key).await?, key)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_lists_parse() {
        for l in Litmus::ALL {
            assert_eq!(l.name().parse::<Litmus>().unwrap(), l);
        }
        assert_eq!(Litmus::parse_list("all").unwrap(), Litmus::ALL.to_vec());
        assert_eq!(
            Litmus::parse_list("2, 1-insert,2").unwrap(),
            vec![Litmus::ReadWrite, Litmus::DirectWriteInsert]
        );
        assert!(Litmus::parse_list("4").is_err());
        assert!(Litmus::parse_list("").is_err());
    }

    #[test]
    fn assertions_accept_serial_outcomes_only() {
        use Litmus::*;
        assert!(DirectWrite.assert_final(&[Some(2), Some(2)]).is_ok());
        assert!(DirectWrite.assert_final(&[Some(1), Some(2)]).is_err());
        assert!(DirectWriteInsert.assert_final(&[None, None]).is_ok());
        assert!(DirectWriteInsert.assert_final(&[Some(1), None]).is_err());
        assert!(DirectWriteDelete.assert_final(&[None, Some(2)]).is_err());
        for ok in [(0, 0), (0, 1), (1, 0), (2, 1), (1, 2)] {
            assert!(ReadWrite.assert_final(&[Some(ok.0), Some(ok.1)]).is_ok());
        }
        assert!(ReadWrite.assert_final(&[Some(1), Some(1)]).is_err());
        let si = dmem_txn::Isolation::Snapshot;
        assert!(
            ReadWrite
                .assert_final_under(&[Some(1), Some(1)], si)
                .is_ok()
        );
        assert!(
            ReadWrite
                .assert_final_under(&[Some(2), Some(2)], si)
                .is_err()
        );
        assert!(
            DirectWrite
                .assert_final_under(&[Some(1), Some(2)], si)
                .is_err()
        );
        assert!(
            IndirectWrite
                .assert_final(&[Some(2), Some(1), Some(2)])
                .is_ok()
        );
        assert!(
            IndirectWrite
                .assert_final(&[Some(0), Some(0), Some(1)])
                .is_err()
        );
    }
}
