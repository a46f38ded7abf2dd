//! What the device part does on a host without an RDMA device (CI, the development
//! machines): opening fails with `RdmaError::NoDevice` and one readable line, whether
//! libibverbs is missing or lists nothing. Skipped where a device exists.
#![cfg(feature = "device")]

use dmem_rdma::RdmaError;
use dmem_rdma::device::RdmaDevice;

fn has_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn opening_without_a_device_is_no_device_with_one_line() {
    if has_device() {
        eprintln!("skipped: this host has an RDMA device");
        return;
    }
    for name in [None, Some("mlx5_0")] {
        let err = RdmaDevice::open(name).unwrap_err();
        assert!(matches!(err, RdmaError::NoDevice(_)), "{err:?}");
        let line = err.to_string();
        assert!(line.starts_with("no RDMA device found ("), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
}
