//! Fuzz target: `RpcFrame::new_checked` on arbitrary bytes.
//!
//! Any input must be either refused with a `LayoutError` or accepted as a frame whose
//! messages iterate to exactly `msg_count` items and re-encode, through the builder, to the
//! very same bytes. A panic anywhere is a bug.
#![no_main]

use dmem_layout::rpc::{RpcFrame, RpcFrameBuilder, RpcPacketInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = RpcFrame::new_checked(data) else {
        return;
    };
    let count = frame.messages().count();
    assert_eq!(count, usize::from(frame.msg_count()));

    let info = RpcPacketInfo {
        src_node: frame.src_node(),
        flow: frame.flow(),
        response: frame.is_response(),
        epoch: frame.epoch(),
    };
    let mut out = vec![0u8; data.len()];
    let mut builder = RpcFrameBuilder::new(&mut out, info).expect("a valid frame holds a header");
    for message in frame.messages() {
        builder
            .push(message.msg_type(), message.req_slot(), message.payload())
            .expect("a message of a valid frame fits a buffer of the frame's size");
    }
    assert_eq!(builder.finish(), data);
});
