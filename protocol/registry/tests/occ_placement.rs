//! A CN process's cores share one dry load (`Deployment::placement`,
//! `Protocol::deploy_placed`): a deployment placed from another's loader gives every loaded
//! record the same slot, gives a new key the slot the loader's directory would give next,
//! and keeps its own later slots to itself.

use std::cell::RefCell;
use std::rc::Rc;

use dmem_deploy::{DeploySpec, MnMemory, Protocol, Recorder, TableDemand};
use dmem_occ::OoccConfig;
use dmem_protocols::{OoccDeployment, OoccProtocol};
use dmem_txn::{History, Key, TableId};
use dmem_verbs::{MemoryRegion, NodeId, RKey};

const T: TableId = TableId(1);

fn spec() -> DeploySpec {
    DeploySpec::new(
        vec![TableDemand {
            id: T,
            value_len: 8,
            expected_records: 100,
            grows: true,
        }],
        4,
    )
}

fn remote(protocol: &OoccProtocol, spec: &DeploySpec) -> MnMemory {
    let len = protocol.mn_bytes_per_mn(spec, 2).unwrap();
    MnMemory::remote(
        (0..2)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(7 + u32::from(i)),
                len,
            })
            .collect(),
    )
}

fn recorder() -> Recorder {
    Recorder::new(Rc::new(RefCell::new(History::new())))
}

#[test]
fn a_placed_deployment_agrees_with_the_loader_without_loading() {
    for protocol in [
        OoccProtocol::new("oocc", OoccConfig::default()),
        OoccProtocol::drtm("drtm", dmem_occ::drtm::DrtmConfig::default()),
        OoccProtocol::dslr("dslr", dmem_occ::dslr2pl::DslrConfig::default()),
    ] {
        let spec = spec();
        // The dry run: the loader on the regions alone.
        let mut loaded = protocol
            .deploy_on(remote(&protocol, &spec), &spec, recorder())
            .unwrap();
        for k in 0..100 {
            loaded.load(T, Key(k), &k.to_le_bytes()).unwrap();
        }
        let placement = loaded.placement().expect("OCC hands its placement out");
        // Another core's deployment, placed: nothing loaded on it.
        let placed = protocol
            .deploy_placed(remote(&protocol, &spec), &spec, recorder(), &placement)
            .expect("OCC takes a placement")
            .unwrap();
        let dir = |d: &dyn dmem_deploy::Deployment| {
            d.as_any()
                .downcast_ref::<OoccDeployment>()
                .unwrap()
                .directory()
        };
        let (loaded_dir, placed_dir) = (dir(&*loaded), dir(&*placed));
        let mut all = loaded_dir.all();
        all.sort_by_key(|&(k, _)| k);
        assert_eq!(all.len(), 100);
        let mut placed_all = placed_dir.all();
        placed_all.sort_by_key(|&(k, _)| k);
        assert_eq!(placed_all, all, "{}", protocol.name());
        // A new key takes the slot the loader's directory would have given it next, and a
        // slot given here stays here.
        let fresh = placed_dir.slot(T, Key(1000)).unwrap();
        assert!(all.iter().all(|&(_, loc)| loc != fresh));
        assert_eq!(loaded_dir.get(T, Key(1000)), None);
        assert_eq!(loaded_dir.slot(T, Key(1000)).unwrap(), fresh);
        // Only OCC's own placement is taken.
        let foreign: dmem_deploy::Placement = std::sync::Arc::new(5u32);
        assert!(
            protocol
                .deploy_placed(remote(&protocol, &spec), &spec, recorder(), &foreign)
                .unwrap()
                .is_err()
        );
    }
}
