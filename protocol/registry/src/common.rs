//! Deployment pieces every protocol of this crate uses alike.

use std::sync::Arc;

use dmem_deploy::{DeployError, Placement};
#[cfg(doc)]
use dmem_deploy::{Deployment, Protocol};
use dmem_store::LoadIndex;

/// `placement` as a loader's [`LoadIndex`] (FORD's, Pandora's and Motor's placement), or
/// one line saying it is another protocol's.
pub(crate) fn placed_index(
    protocol: &str,
    placement: &Placement,
) -> Result<Arc<LoadIndex>, DeployError> {
    Arc::clone(placement)
        .downcast::<LoadIndex>()
        .map_err(|_| DeployError::Protocol {
            protocol: protocol.to_owned(),
            reason: "a placement of another protocol (not a record loader's index)".to_owned(),
        })
}

/// The error of [`Deployment::load`] on a deployment made by [`Protocol::deploy_placed`].
pub(crate) fn load_on_placed(protocol: &str) -> DeployError {
    DeployError::Protocol {
        protocol: protocol.to_owned(),
        reason:
            "its records were placed by another deployment's loader (deploy_placed); load there"
                .to_owned(),
    }
}
