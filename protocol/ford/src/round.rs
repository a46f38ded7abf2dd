//! One execution round as plain data (FORD `dtx.cc` `ExeRO`/`ExeRW`, `dtx_issue.cc`): the
//! records a round names are deduplicated, those the transaction already holds are served
//! from its own sets, and the rest are fetched together — first one index-bucket READ per
//! record whose address is not cached, then a READ of every read-only record and a
//! CAS + READ of every for-update record, one doorbell per MN, all MNs at once.
//!
//! The async shell (`FordTxn::read_round`) posts the lists built here and hands the
//! completions back; every decision about what to post is made here, so a test can drive
//! a round step by step without a fabric.
//!
//! Deviation from FORD's code: FORD stores items inside its hash buckets, so a cache miss
//! costs one READ of the whole bucket and no more; dmem's index holds addresses (so the
//! same MN store serves the multi-version protocols too), so a miss costs a bucket READ
//! round before the item round. Deployments warm the address cache from the loader (what
//! a CN that scanned the index at start-up knows), which makes the steady state match.

use dmem_txn::{Access, Key, ReadReq, TableId};
use dmem_verbs::{BatchResult, PostList, WrId};

use crate::store::{BucketLoc, ItemLoc, Store, StoreError, parse_bucket};

/// Where a fetched record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Located {
    /// Its item.
    Found(ItemLoc),
    /// Not in the index: its bucket (validated at commit) and the bucket's first free slot.
    Absent {
        /// The bucket that would index it.
        bucket: BucketLoc,
        /// The first free slot an insert may claim, if any (none while a slot of a hashed
        /// pooled table is half claimed: `TableLayout::insert_slot`).
        free: Option<usize>,
    },
}

/// One distinct record the round fetches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fetch {
    pub(crate) table: TableId,
    pub(crate) key: Key,
    /// For update if any request of the round for this record is.
    pub(crate) access: Access,
    /// Known from the address cache or the bucket READ.
    pub(crate) located: Option<Located>,
}

/// How the round answers one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// From the transaction's own read or write set: no verb.
    Local(Option<Vec<u8>>),
    /// From fetch number `n`.
    Fetched(usize),
}

/// A round after deduplication: what each request is answered from, and the records to
/// fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoundPlan {
    pub(crate) answers: Vec<Answer>,
    pub(crate) fetches: Vec<Fetch>,
}

impl RoundPlan {
    /// Plans `reqs`: `local` answers a request from the transaction's own sets (`Some`) or
    /// says it must be fetched (`None`); `cached` is the address cache.
    pub(crate) fn new(
        reqs: &[ReadReq],
        mut local: impl FnMut(&ReadReq) -> Option<Option<Vec<u8>>>,
        mut cached: impl FnMut(TableId, Key) -> Option<ItemLoc>,
    ) -> Self {
        let mut answers = Vec::with_capacity(reqs.len());
        let mut fetches: Vec<Fetch> = Vec::new();
        for r in reqs {
            if let Some(v) = local(r) {
                answers.push(Answer::Local(v));
                continue;
            }
            if let Some(n) = fetches
                .iter()
                .position(|f| f.table == r.table && f.key == r.key)
            {
                if r.access == Access::ForUpdate {
                    fetches[n].access = Access::ForUpdate;
                }
                answers.push(Answer::Fetched(n));
                continue;
            }
            fetches.push(Fetch {
                table: r.table,
                key: r.key,
                access: r.access,
                located: cached(r.table, r.key).map(Located::Found),
            });
            answers.push(Answer::Fetched(fetches.len() - 1));
        }
        Self { answers, fetches }
    }

    /// The bucket READs of every fetch whose address is unknown (one per distinct bucket),
    /// to the current primaries; `None` when every address is known.
    ///
    /// # Errors
    /// A [`StoreError`] for an unknown table or a partition with no live replica.
    pub(crate) fn locate_list(
        &self,
        store: &Store,
    ) -> Result<Option<(PostList, Vec<BucketRead>)>, StoreError> {
        let mut list = PostList::new();
        let mut ids: Vec<BucketRead> = Vec::new();
        for (n, f) in self.fetches.iter().enumerate() {
            if f.located.is_some() {
                continue;
            }
            let bucket = store.bucket_of(f.table, f.key)?;
            let wr = match ids.iter().find(|(_, b, _)| *b == bucket) {
                Some(&(_, _, wr)) => wr,
                None => {
                    let p = store.primary(bucket.partition)?;
                    list.read(store.addr(p, bucket.offset), bucket.read_len())
                }
            };
            ids.push((n, bucket, wr));
        }
        Ok((!ids.is_empty()).then_some((list, ids)))
    }

    /// Takes the bucket READs' results: each located fetch is `Found` (and returned, to be
    /// cached) or `Absent`.
    ///
    /// # Errors
    /// A [`StoreError`] for an unknown table.
    pub(crate) fn absorb_locate(
        &mut self,
        store: &Store,
        ids: &[BucketRead],
        res: &BatchResult,
    ) -> Result<Vec<(TableId, Key, ItemLoc)>, StoreError> {
        let mut found = Vec::new();
        for &(n, bucket, wr) in ids {
            let bytes = res.bytes(wr);
            let (used, free) = parse_bucket(bytes);
            let f = &mut self.fetches[n];
            f.located = Some(match used.iter().find(|(_, k)| *k == f.key.0) {
                Some(&(slot, _)) => {
                    let loc = store.item_in_bucket(bucket, slot, bytes)?;
                    found.push((f.table, f.key, loc));
                    Located::Found(loc)
                }
                None => Located::Absent {
                    bucket,
                    free: store.table(f.table)?.insert_slot(&used, free),
                },
            });
        }
        Ok(found)
    }
}

/// A bucket READ of the locate list: the fetch it locates, its bucket, its work request
/// (shared by fetches in one bucket).
pub(crate) type BucketRead = (usize, BucketLoc, WrId);

/// The work requests of one fetched item in the access list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ItemWrs {
    /// The fetch.
    pub(crate) fetch: usize,
    /// The lock CAS (for-update only).
    pub(crate) cas: Option<WrId>,
    /// The item READ.
    pub(crate) read: WrId,
}

/// The access list: a READ of each read-only item, a CAS (`0 → lock`) then a READ of each
/// for-update item, to the primary (FORD reads and locks primaries only).
///
/// `addr_len` gives an item's primary address and length.
///
/// # Errors
/// Whatever `addr_len` fails with.
pub(crate) fn access_list<E>(
    fetches: &[Fetch],
    lock: u64,
    mut addr_len: impl FnMut(&Fetch, &ItemLoc) -> Result<(dmem_verbs::RemoteAddr, u32), E>,
) -> Result<(PostList, Vec<ItemWrs>), E> {
    let mut list = PostList::new();
    let mut wrs = Vec::new();
    for (n, f) in fetches.iter().enumerate() {
        let Some(Located::Found(loc)) = &f.located else {
            continue;
        };
        let (addr, len) = addr_len(f, loc)?;
        let cas = (f.access == Access::ForUpdate).then(|| list.cas(addr, 0, lock));
        let read = list.read(addr, len);
        wrs.push(ItemWrs {
            fetch: n,
            cas,
            read,
        });
    }
    Ok((list, wrs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreConfig, TableSpec};
    use dmem_verbs::{MemoryRegion, NodeId, Op, RKey, WrOutcome};

    const T: TableId = TableId(1);

    fn store() -> Store {
        let regions = (0..3)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(1),
                len: 1 << 22,
            })
            .collect();
        Store::new(
            StoreConfig::new(3)
                .table(TableSpec::sized_for(T, 8, 1000, 3))
                .coordinators(4),
            regions,
        )
        .unwrap()
    }

    #[test]
    fn duplicates_merge_and_for_update_wins() {
        let reqs = [
            ReadReq::read(T, Key(1)),
            ReadReq::for_update(T, Key(2)),
            ReadReq::for_update(T, Key(1)),
            ReadReq::read(T, Key(3)),
        ];
        let plan = RoundPlan::new(
            &reqs,
            |r| (r.key == Key(3)).then_some(Some(vec![3])),
            |_, _| None,
        );
        assert_eq!(
            plan.answers,
            vec![
                Answer::Fetched(0),
                Answer::Fetched(1),
                Answer::Fetched(0),
                Answer::Local(Some(vec![3]))
            ]
        );
        assert_eq!(plan.fetches.len(), 2);
        assert_eq!(plan.fetches[0].access, Access::ForUpdate);
    }

    #[test]
    fn one_bucket_read_per_uncached_record_then_read_or_cas_read() {
        let s = store();
        let cached_loc = s.item_at(s.bucket_of(T, Key(7)).unwrap(), 0).unwrap();
        let reqs = [
            ReadReq::read(T, Key(5)),
            ReadReq::for_update(T, Key(6)),
            ReadReq::for_update(T, Key(7)),
        ];
        let mut plan = RoundPlan::new(&reqs, |_| None, |_, k| (k == Key(7)).then_some(cached_loc));
        let (list, ids) = plan.locate_list(&s).unwrap().unwrap();
        assert_eq!(ids.len(), 2, "key 7 is cached");
        let wrs = list.finish().unwrap();
        assert!(wrs.iter().all(
            |w| matches!(w.op, Op::Read { len, .. } if len == crate::store::BUCKET_LEN as u32)
        ));
        // Key 5 is in slot 0 of its bucket, key 6 is absent with slot 0 free.
        let mut bucket5 = vec![0u8; crate::store::BUCKET_LEN];
        let slot = crate::store::index_slot_bytes(5, crate::logic::pack_location(0, 64));
        let at = crate::store::slot_offset(0) as usize;
        bucket5[at..at + 16].copy_from_slice(&slot);
        let empty = vec![0u8; crate::store::BUCKET_LEN];
        // One outcome per distinct bucket READ, in list order.
        let mut seen = Vec::new();
        let mut outcomes = Vec::new();
        for (n, _, wr) in &ids {
            if !seen.contains(wr) {
                seen.push(*wr);
                outcomes.push(WrOutcome::Bytes(if *n == 0 {
                    bucket5.clone().into()
                } else {
                    empty.clone().into()
                }));
            }
        }
        assert_eq!(outcomes.len(), 2, "keys 5 and 6 hash to different buckets");
        let found = plan
            .absorb_locate(&s, &ids, &BatchResult::new(outcomes))
            .unwrap();
        assert_eq!(found.len(), 1);
        assert!(matches!(
            plan.fetches[1].located,
            Some(Located::Absent { free: Some(0), .. })
        ));
        let (list, wrs) =
            access_list::<()>(&plan.fetches, 99, |_, loc| Ok((s.addr(0, loc.offset), 48))).unwrap();
        assert_eq!(wrs.len(), 2, "absent key 6 needs no item access");
        assert!(wrs[0].cas.is_none() && wrs[1].cas.is_some());
        let ops: Vec<_> = list.finish().unwrap().into_iter().map(|w| w.op).collect();
        assert!(matches!(ops[0], Op::Read { .. }));
        assert!(matches!(
            ops[1],
            Op::Cas {
                expect: 0,
                swap: 99,
                ..
            }
        ));
        assert!(matches!(ops[2], Op::Read { .. }));
    }
}
