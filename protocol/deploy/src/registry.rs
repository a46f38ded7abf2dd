//! Protocols by name.

use std::sync::Arc;

use crate::{DeployError, Protocol};

/// Makes a protocol from the parameters after `prefix:` (`ford:covert-locks+lost-decision`
/// → `covert-locks+lost-decision`), or says why it cannot.
pub type Family = Box<dyn Fn(&str) -> Result<Arc<dyn Protocol>, String> + Send + Sync>;

/// Every protocol a command can run, registered once by name: `dmem bench --protocol X`
/// and `dmem litmus --protocol X` accept any name here, with no change to the CLI.
#[derive(Default)]
pub struct Registry {
    protocols: Vec<Arc<dyn Protocol>>,
    families: Vec<(String, String, Family)>,
}

impl core::fmt::Debug for Registry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Registry")
            .field("names", &self.names())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `protocol` under its [`name`](Protocol::name).
    ///
    /// # Errors
    /// [`DeployError::Duplicate`] if the name is taken.
    pub fn register(&mut self, protocol: impl Protocol + 'static) -> Result<(), DeployError> {
        let name = protocol.name();
        if self.protocols.iter().any(|p| p.name() == name)
            || self.families.iter().any(|(prefix, _, _)| *prefix == name)
        {
            return Err(DeployError::Duplicate(name));
        }
        self.protocols.push(Arc::new(protocol));
        Ok(())
    }

    /// Registers a family of protocols named `prefix:PARAMS`; `usage` is how the error of
    /// an unknown name lists it (`ford:BUG[+BUG]`).
    ///
    /// # Errors
    /// [`DeployError::Duplicate`] if the prefix is taken.
    pub fn register_family(
        &mut self,
        prefix: &str,
        usage: &str,
        make: Family,
    ) -> Result<(), DeployError> {
        if self.families.iter().any(|(p, _, _)| p == prefix) {
            return Err(DeployError::Duplicate(prefix.to_owned()));
        }
        self.families
            .push((prefix.to_owned(), usage.to_owned(), make));
        Ok(())
    }

    /// The protocol named `name`: a registered name, or `prefix:PARAMS` of a family.
    ///
    /// # Errors
    /// [`DeployError::UnknownProtocol`] listing the known names, or
    /// [`DeployError::BadParameters`] if a family refuses the parameters.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Protocol>, DeployError> {
        if let Some(p) = self.protocols.iter().find(|p| p.name() == name) {
            return Ok(Arc::clone(p));
        }
        if let Some((prefix, params)) = name.split_once(':')
            && let Some((_, _, make)) = self.families.iter().find(|(p, _, _)| p == prefix)
        {
            return make(params).map_err(|reason| DeployError::BadParameters {
                name: name.to_owned(),
                reason,
            });
        }
        Err(DeployError::UnknownProtocol {
            name: name.to_owned(),
            known: self.names(),
        })
    }

    /// Every registered name, then every family's usage, in registration order.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        self.protocols
            .iter()
            .map(|p| p.name())
            .chain(self.families.iter().map(|(_, usage, _)| usage.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeploySpec, Deployment, MnMemory, Recorder};

    /// A protocol that only has a name: enough to test lookups.
    struct Named(String);

    impl Protocol for Named {
        fn name(&self) -> String {
            self.0.clone()
        }
        fn mn_bytes_per_mn(&self, _: &DeploySpec, _: u16) -> Result<u64, DeployError> {
            Ok(0)
        }
        fn deploy_on(
            &self,
            _: MnMemory,
            _: &DeploySpec,
            _: Recorder,
        ) -> Result<Box<dyn Deployment>, DeployError> {
            Err(DeployError::Protocol {
                protocol: self.0.clone(),
                reason: "lookup-only test protocol".to_owned(),
            })
        }
    }

    fn registry() -> Registry {
        let mut r = Registry::new();
        r.register(Named("a".into())).unwrap();
        r.register(Named("b".into())).unwrap();
        r.register_family(
            "fam",
            "fam:N",
            Box::new(|params: &str| {
                params
                    .parse::<u32>()
                    .map(|n| Arc::new(Named(format!("fam:{n}"))) as Arc<dyn Protocol>)
                    .map_err(|e| e.to_string())
            }),
        )
        .unwrap();
        r
    }

    #[test]
    fn finds_names_and_family_members() {
        let r = registry();
        assert_eq!(r.get("b").unwrap().name(), "b");
        assert_eq!(r.get("fam:7").unwrap().name(), "fam:7");
        assert_eq!(r.names(), vec!["a", "b", "fam:N"]);
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let r = registry();
        let err = r.get("c").err().unwrap();
        assert!(matches!(err, DeployError::UnknownProtocol { .. }));
        assert_eq!(
            err.to_string(),
            "unknown protocol `c`: known protocols are a, b, fam:N"
        );
        assert!(matches!(
            r.get("fam:x").err().unwrap(),
            DeployError::BadParameters { .. }
        ));
        assert!(matches!(
            r.get("nofam:1").err().unwrap(),
            DeployError::UnknownProtocol { .. }
        ));
    }

    #[test]
    fn duplicate_names_are_refused() {
        let mut r = registry();
        assert!(matches!(
            r.register(Named("a".into())),
            Err(DeployError::Duplicate(n)) if n == "a"
        ));
        assert!(
            r.register_family("fam", "fam:M", Box::new(|_: &str| Err(String::new())))
                .is_err()
        );
    }
}
