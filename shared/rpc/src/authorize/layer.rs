use std::sync::Arc;

use super::{Authorize, Policy, Refusals};

/// Puts [`Authorize`] in front of a service.
#[derive(Debug, Clone)]
pub struct AuthorizeLayer {
    policy: Policy,
    refusals: Arc<Refusals>,
}

impl AuthorizeLayer {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            refusals: Arc::new(Refusals::new()),
        }
    }
}

impl<S> tower::Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorize {
            inner,
            policy: self.policy.clone(),
            refusals: self.refusals.clone(),
        }
    }
}
