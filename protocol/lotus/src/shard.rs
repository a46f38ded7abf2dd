//! Application-aware lock sharding (LOTUS §4.2) and hybrid routing (§4.3).
//!
//! A record's *lock key* is a 64-bit hash of its table and key; its *shard number* is the
//! low 12 bits of its table's critical field ([`CriticalField`]; TPC-C warehouse, TATP
//! subscriber, SmallBank account), or of the lock key's hash for tables without one (KVS:
//! "data is sharded randomly"). [`ShardMap`] maps the 4096 shards to CNs; a CN serves lock
//! requests only for shards it owns and refuses the others, and the requester then
//! retries with the map it reads afresh.
//!
//! Deviation: the paper distributes "the key range" evenly over CNs; shard `s` goes to CN
//! `s mod cns` here. A contiguous split would put all of a small TPC-C's warehouses
//! (numbers 1..W, W ≪ 4096) on the first CN.

use dmem_txn::{CriticalField, Key, TableId, TxnKind};

/// Shards (12-bit shard numbers, LOTUS §4.2).
pub const SHARDS: usize = 4096;

/// The splitmix64 hash every node computes alike.
pub use dmem_layout::mix::splitmix64 as mix64;

/// The lock key of a record: a hash of table and key (the fingerprint and bucket of the
/// CN lock table come from it).
#[must_use]
pub fn record_lock_key(table: TableId, key: Key) -> u64 {
    mix64(mix64(u64::from(table.0)) ^ key.0)
}

/// The lock key of an index bucket at `offset` of partition `partition` (LOTUS §4.1:
/// inserts lock the key and the index bucket they insert into).
#[must_use]
pub fn bucket_lock_key(partition: u16, offset: u64) -> u64 {
    mix64(0xB0C4_E700_0000_0000 ^ (u64::from(partition) << 48) ^ offset)
}

/// How keys map to shards: the critical field of each table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sharding {
    fields: Vec<(TableId, CriticalField)>,
    /// Ablation (LOTUS §8.3 "no sharding"): every record sharded by hash.
    pub random: bool,
}

impl Sharding {
    /// Sharding by `fields` (tables not listed: by hash).
    #[must_use]
    pub fn new(fields: Vec<(TableId, CriticalField)>) -> Self {
        Self {
            fields,
            random: false,
        }
    }

    /// The shard number of a record (LOTUS §4.2, Fig. 7).
    #[must_use]
    pub fn shard_of(&self, table: TableId, key: Key) -> u16 {
        let field = if self.random {
            None
        } else {
            self.fields
                .iter()
                .find(|(t, _)| *t == table)
                .map(|(_, f)| *f)
        };
        let v = match field {
            Some(f) => f.value(key),
            None => record_lock_key(table, key),
        };
        (v & (SHARDS as u64 - 1)) as u16
    }

    /// The shard of an index bucket's lock (hashed: buckets mix keys of any shard).
    #[must_use]
    pub fn bucket_shard(lock_key: u64) -> u16 {
        (mix64(lock_key) & (SHARDS as u64 - 1)) as u16
    }
}

/// The shard-to-CN map (LOTUS §4.2 "Mapping Shards to Compute Nodes").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    owner: Vec<u16>,
    /// Shards being handed over (§4.3): served by no CN until the receiver takes them.
    moving: Vec<bool>,
    /// Per shard, bumped when a hand-over aborts the shard's holders: a lock granted under
    /// an older generation is no longer valid at commit.
    generation: Vec<u32>,
    cns: u16,
    /// Bumped by every change; requesters holding an older map retry with the new one.
    pub epoch: u64,
}

impl ShardMap {
    /// Shards spread over `cns` CNs (at least one): shard `s` on CN `s mod cns`.
    #[must_use]
    pub fn new(cns: u16) -> Self {
        let cns = cns.max(1);
        Self {
            owner: (0..SHARDS).map(|s| (s % usize::from(cns)) as u16).collect(),
            moving: vec![false; SHARDS],
            generation: vec![0; SHARDS],
            cns,
            epoch: 0,
        }
    }

    /// CNs in the map.
    #[must_use]
    pub fn cns(&self) -> u16 {
        self.cns
    }

    /// The CN owning `shard`.
    #[must_use]
    pub fn owner(&self, shard: u16) -> u16 {
        self.owner[usize::from(shard) % SHARDS]
    }

    /// Gives `shard` to `cn` (resharding, recovery's takeover).
    pub fn assign(&mut self, shard: u16, cn: u16) {
        self.owner[usize::from(shard) % SHARDS] = cn;
        self.epoch += 1;
    }

    /// Whether `cn` serves lock requests for `shard` now: it owns it and is not handing it
    /// over.
    #[must_use]
    pub fn serves(&self, cn: u16, shard: u16) -> bool {
        let s = usize::from(shard) % SHARDS;
        self.owner[s] == cn && !self.moving[s]
    }

    /// Whether `shard` is being handed over.
    #[must_use]
    pub fn is_moving(&self, shard: u16) -> bool {
        self.moving[usize::from(shard) % SHARDS]
    }

    /// The shard's generation (see [`ShardMap::abort_holders`]).
    #[must_use]
    pub fn generation(&self, shard: u16) -> u32 {
        self.generation[usize::from(shard) % SHARDS]
    }

    /// Resharding (§4.3) step 1: the owner stops serving `shard`.
    pub fn begin_move(&mut self, shard: u16) {
        self.moving[usize::from(shard) % SHARDS] = true;
        self.epoch += 1;
    }

    /// Resharding: the shard's current lock holders lose their locks (their transactions
    /// abort when they reach commit).
    pub fn abort_holders(&mut self, shard: u16) {
        let g = &mut self.generation[usize::from(shard) % SHARDS];
        *g = g.wrapping_add(1);
    }

    /// Resharding's last step: `cn` owns and serves `shard`.
    pub fn finish_move(&mut self, shard: u16, cn: u16) {
        self.moving[usize::from(shard) % SHARDS] = false;
        self.assign(shard, cn);
    }

    /// Shards owned by `cn`.
    #[must_use]
    pub fn shards_of(&self, cn: u16) -> Vec<u16> {
        (0..SHARDS as u16)
            .filter(|&s| self.owner(s) == cn)
            .collect()
    }

    /// Hybrid routing (LOTUS §4.3): a read-only transaction to a uniformly random CN
    /// (`random` is the caller's draw), a read-write one to the owner of its first
    /// record's shard.
    #[must_use]
    pub fn route(
        &self,
        sharding: &Sharding,
        kind: TxnKind,
        first: Option<(TableId, Key)>,
        random: u64,
    ) -> Option<u16> {
        match (kind, first) {
            (TxnKind::ReadWrite, Some((t, k))) => Some(self.owner(sharding.shard_of(t, k))),
            _ => Some((random % u64::from(self.cns)) as u16),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn critical_field_decides_the_shard() {
        // TPC-C-like: warehouse in bits 48.., everything of warehouse 7 in shard 7.
        let s = Sharding::new(vec![(
            TableId(1),
            CriticalField {
                shift: 48,
                bits: 15,
            },
        )]);
        for low in [0u64, 1, 0xffff_ffff] {
            assert_eq!(s.shard_of(TableId(1), Key(7 << 48 | low)), 7);
        }
        // 4096 + 7 wraps to shard 7 (low 12 bits).
        assert_eq!(s.shard_of(TableId(1), Key(4103 << 48)), 7);
        // A table without a critical field is hashed.
        let a = s.shard_of(TableId(2), Key(1));
        assert_eq!(a, (record_lock_key(TableId(2), Key(1)) & 0xfff) as u16);
        let mut r = s.clone();
        r.random = true;
        assert_ne!(
            (0..64)
                .map(|w| r.shard_of(TableId(1), Key(w << 48)))
                .collect::<Vec<_>>(),
            (0..64).collect::<Vec<u16>>()
        );
    }

    #[test]
    fn map_routes_rw_to_the_owner_and_ro_anywhere() {
        let s = Sharding::new(vec![(TableId(0), CriticalField::WHOLE_KEY)]);
        let mut m = ShardMap::new(9);
        assert_eq!(m.owner(10), 1);
        assert_eq!(
            m.route(&s, TxnKind::ReadWrite, Some((TableId(0), Key(10))), 5),
            Some(1)
        );
        assert_eq!(
            m.route(&s, TxnKind::ReadOnly, Some((TableId(0), Key(10))), 5),
            Some(5)
        );
        m.assign(10, 4);
        assert_eq!((m.owner(10), m.epoch), (4, 1));
        // 4096 = 9 × 455 + 1: CN 4 has 455 shards, plus shard 10.
        assert_eq!(m.shards_of(4).len(), 456);
    }
}
