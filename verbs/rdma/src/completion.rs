//! Routing completions to the posts waiting for them.
//!
//! Several tasks of one thread post on the same completion queue; whichever polls drains it
//! and records each completion here by its `wr_id` ([`crate::chain::wr_id`]). A post is done
//! when all its signaled work requests have completed (a reliable connection executes in
//! order, so the earlier unsignaled ones have too), or at its first error: an error always
//! completes, signaled or not, and the queue pair flushes the rest.

use std::collections::HashMap;
use std::task::Waker;

use crate::chain::split_wr_id;

/// `IBV_WC_SUCCESS`.
pub const WC_SUCCESS: u32 = 0;
/// `IBV_WC_REM_ACCESS_ERR`: the responder refused the access (rkey, bounds, rights).
pub const WC_REM_ACCESS_ERR: u32 = 10;
/// `IBV_WC_WR_FLUSH_ERR`: flushed because the queue pair went to ERROR.
pub const WC_WR_FLUSH_ERR: u32 = 5;

/// How a post ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostOutcome {
    /// Every signaled work request completed successfully.
    Done,
    /// Work request `index` completed with `status` (an `ibv_wc_status`).
    Failed {
        /// Its position in the post list.
        index: u32,
        /// The completion status.
        status: u32,
    },
}

#[derive(Debug)]
struct Pending {
    remaining: usize,
    outcome: Option<PostOutcome>,
    waker: Option<Waker>,
}

/// Posts in flight on one completion queue.
#[derive(Debug, Default)]
pub struct CompletionTable {
    pending: HashMap<u32, Pending>,
    next_seq: u32,
}

impl CompletionTable {
    /// An empty table.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Reserves a sequence number for a post that will wait for `signaled` completions.
    pub fn register(&mut self, signaled: usize) -> u32 {
        let seq = loop {
            let s = self.next_seq;
            self.next_seq = self.next_seq.wrapping_add(1);
            if !self.pending.contains_key(&s) {
                break s;
            }
        };
        self.pending.insert(
            seq,
            Pending {
                remaining: signaled,
                outcome: (signaled == 0).then_some(PostOutcome::Done),
                waker: None,
            },
        );
        seq
    }

    /// Reserves a sequence number before the number of signaled work requests is known
    /// (the `wr_id`s embed it); [`expect`](Self::expect) sets it once the chains are built.
    pub fn reserve(&mut self) -> u32 {
        let seq = self.register(1);
        if let Some(p) = self.pending.get_mut(&seq) {
            p.remaining = usize::MAX;
        }
        seq
    }

    /// Sets how many signaled completions post `seq` waits for (none: done at once).
    pub fn expect(&mut self, seq: u32, signaled: usize) {
        if let Some(p) = self.pending.get_mut(&seq) {
            p.remaining = signaled;
            if signaled == 0 && p.outcome.is_none() {
                p.outcome = Some(PostOutcome::Done);
            }
        }
    }

    /// Lowers the completions post `seq` still waits for by `n` (work requests that were
    /// never posted); finishes it if none are left.
    pub fn reduce(&mut self, seq: u32, n: usize) {
        if let Some(p) = self.pending.get_mut(&seq) {
            p.remaining = p.remaining.saturating_sub(n);
            if p.remaining == 0 && p.outcome.is_none() {
                p.outcome = Some(PostOutcome::Done);
                if let Some(w) = p.waker.take() {
                    w.wake();
                }
            }
        }
    }

    /// Forgets post `seq` (nothing of it was posted).
    pub fn cancel(&mut self, seq: u32) {
        self.pending.remove(&seq);
    }

    /// Records one work completion. Completions of a post already finished (the flushes after
    /// its error) or unknown are ignored. Returns whether a post finished.
    pub fn complete(&mut self, wr_id: u64, status: u32) -> bool {
        let (seq, index) = split_wr_id(wr_id);
        let Some(p) = self.pending.get_mut(&seq) else {
            return false;
        };
        if p.outcome.is_some() {
            return false;
        }
        if status == WC_SUCCESS {
            p.remaining = p.remaining.saturating_sub(1);
            if p.remaining > 0 {
                return false;
            }
            p.outcome = Some(PostOutcome::Done);
        } else {
            p.outcome = Some(PostOutcome::Failed { index, status });
        }
        if let Some(w) = p.waker.take() {
            w.wake();
        }
        true
    }

    /// Takes post `seq`'s outcome if it has finished (forgetting the post), or stores `waker`
    /// to be woken when it does.
    pub fn poll(&mut self, seq: u32, waker: &Waker) -> Option<PostOutcome> {
        let p = self.pending.get_mut(&seq)?;
        match p.outcome {
            Some(o) => {
                self.pending.remove(&seq);
                Some(o)
            }
            None => {
                p.waker = Some(waker.clone());
                None
            }
        }
    }

    /// Fails every unfinished post with work requests to a queue pair that broke: `seqs` are
    /// their sequence numbers.
    pub fn fail_all(&mut self, seqs: impl IntoIterator<Item = u32>, status: u32) {
        for seq in seqs {
            if let Some(p) = self.pending.get_mut(&seq)
                && p.outcome.is_none()
            {
                p.outcome = Some(PostOutcome::Failed { index: 0, status });
                if let Some(w) = p.waker.take() {
                    w.wake();
                }
            }
        }
    }

    /// Posts not yet taken.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::wr_id;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_post_finishes_when_its_last_signaled_completion_arrives() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let mut t = CompletionTable::new();
        let a = t.register(2);
        let b = t.register(1);
        assert_eq!(t.poll(a, &waker), None);
        assert!(!t.complete(wr_id(a, 3), WC_SUCCESS));
        assert!(
            t.complete(wr_id(b, 0), WC_SUCCESS),
            "posts are told apart by seq"
        );
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "b had no waker");
        assert!(t.complete(wr_id(a, 5), WC_SUCCESS));
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "a's waiter woken");
        assert_eq!(t.poll(a, &waker), Some(PostOutcome::Done));
        assert_eq!(t.poll(b, &waker), Some(PostOutcome::Done));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn the_first_error_ends_the_post_and_later_flushes_are_ignored() {
        let waker = Waker::noop().clone();
        let mut t = CompletionTable::new();
        let s = t.register(2);
        assert!(t.complete(wr_id(s, 1), WC_REM_ACCESS_ERR));
        assert!(!t.complete(wr_id(s, 2), WC_WR_FLUSH_ERR));
        assert!(!t.complete(wr_id(s, 3), WC_WR_FLUSH_ERR));
        assert_eq!(
            t.poll(s, &waker),
            Some(PostOutcome::Failed {
                index: 1,
                status: WC_REM_ACCESS_ERR
            })
        );
        assert!(
            !t.complete(wr_id(s, 4), WC_SUCCESS),
            "unknown after it was taken"
        );
    }

    #[test]
    fn broken_queue_pairs_fail_their_posts_and_sequence_numbers_skip_live_ones() {
        let waker = Waker::noop().clone();
        let mut t = CompletionTable::new();
        t.next_seq = u32::MAX;
        let a = t.register(1);
        let b = t.register(1);
        assert_eq!((a, b), (u32::MAX, 0), "wraps");
        t.next_seq = u32::MAX;
        let c = t.register(1);
        assert_eq!(c, 1, "skips the live u32::MAX and 0");
        t.fail_all([a, c], WC_WR_FLUSH_ERR);
        assert!(matches!(
            t.poll(a, &waker),
            Some(PostOutcome::Failed { .. })
        ));
        assert_eq!(t.poll(b, &waker), None);
        assert_eq!(t.register(0), 2);
        assert_eq!(
            t.poll(2, &waker),
            Some(PostOutcome::Done),
            "nothing signaled: done at once"
        );
    }

    #[test]
    fn reserve_then_expect_then_cancel() {
        let waker = Waker::noop().clone();
        let mut t = CompletionTable::new();
        let s = t.reserve();
        assert!(
            !t.complete(wr_id(s, 0), WC_SUCCESS),
            "still unknown how many"
        );
        t.expect(s, 2);
        assert!(!t.complete(wr_id(s, 1), WC_SUCCESS));
        assert!(t.complete(wr_id(s, 2), WC_SUCCESS));
        assert_eq!(t.poll(s, &waker), Some(PostOutcome::Done));
        let s = t.reserve();
        t.expect(s, 3);
        assert!(!t.complete(wr_id(s, 0), WC_SUCCESS));
        t.reduce(s, 1);
        assert_eq!(t.poll(s, &waker), None, "one posted completion still due");
        t.reduce(s, 1);
        assert_eq!(t.poll(s, &waker), Some(PostOutcome::Done));
        let s = t.reserve();
        t.cancel(s);
        assert_eq!(t.poll(s, &waker), None);
        assert_eq!(t.in_flight(), 0);
    }
}
