//! Waiting for a message with a deadline.

use core::future::{Future, poll_fn};
use core::pin::pin;
use core::task::Poll;

use crate::{Clock, Message, Nanos, Verbs, VerbsError};

/// The next message for `ctx`, or `Ok(None)` at `deadline`.
///
/// Each poll tries the receive first, then the deadline: a message already queued is
/// returned even when `deadline` has passed. The receive is polled (and so armed) once
/// even then; a caller that must not leave a receive armed past its deadline checks the
/// clock first.
///
/// # Errors
/// The receive's error (this node crashed, its endpoint closed).
pub async fn recv_until<V: Verbs + Clock>(
    ctx: &V,
    deadline: Nanos,
) -> Result<Option<Message>, VerbsError> {
    let mut recv = pin!(ctx.recv());
    let mut sleep = pin!(ctx.sleep_until(deadline));
    poll_fn(|cx| {
        if let Poll::Ready(m) = recv.as_mut().poll(cx) {
            return Poll::Ready(m.map(Some));
        }
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ok(None));
        }
        Poll::Pending
    })
    .await
}
