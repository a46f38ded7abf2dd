//! `ford:artifact`: FORD's public code's commit verbs, a switch of the ford family (not a
//! bug), alone or with bugs and a restart; an unknown switch is still an error.

use dmem_protocols::FordProtocol;

#[test]
fn artifact_is_a_ford_switch() {
    let r = dmem_protocols::registry();
    for name in [
        "ford:artifact",
        "ford:artifact+lost-decision",
        "ford:covert-locks+artifact",
        "ford:artifact+restart=1000",
    ] {
        let p = r.get(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.name(), name);
    }
    assert!(r.get("ford:artefact").is_err());
    assert!(
        r.get("pandora:artifact").is_err(),
        "only FORD's code has these verbs"
    );
    let lean = FordProtocol::new("ford", dmem_ford::ProtocolConfig::ford_fixed());
    assert!(!lean.config().artifact);
    assert!(
        dmem_ford::ProtocolConfig::ford_fixed()
            .with_artifact_verbs()
            .artifact
    );
}
