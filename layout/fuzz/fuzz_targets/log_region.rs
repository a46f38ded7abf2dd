//! Fuzz target: `LogRegion::new_checked` on arbitrary bytes.
//!
//! The CRC makes random inputs fail early, so the target also retries each input with its
//! checksum recomputed, which lets the fuzzer reach the record parser. An accepted region
//! must iterate exactly `record_count` records; a panic anywhere is a bug.
#![no_main]

use dmem_layout::log::{LogRegion, LogRegionHeader, crc32c};
use libfuzzer_sys::fuzz_target;

fn check(bytes: &[u8]) {
    if let Ok(region) = LogRegion::new_checked(bytes) {
        let count = region.records().count();
        assert_eq!(count, usize::from(region.header().record_count()));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Recompute the checksum the way the writer does: header bytes 0..24 and 28..31,
    // then the body.
    if data.len() < LogRegionHeader::LEN {
        return;
    }
    let body_len = u32::from_le_bytes([data[16], data[17], data[18], data[19]]) as usize;
    let Some(body) = data.get(LogRegionHeader::LEN..LogRegionHeader::LEN.saturating_add(body_len))
    else {
        return;
    };
    let mut covered = Vec::with_capacity(27 + body.len());
    covered.extend_from_slice(&data[..24]);
    covered.extend_from_slice(&data[28..31]);
    covered.extend_from_slice(body);
    let mut fixed = data.to_vec();
    fixed[24..28].copy_from_slice(&crc32c(&covered).to_le_bytes());
    check(&fixed);
});
