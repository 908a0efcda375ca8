use super::{Authorize, Policy};

/// Puts [`Authorize`] in front of a service.
#[derive(Debug, Clone)]
pub struct AuthorizeLayer {
    policy: Policy,
}

impl AuthorizeLayer {
    pub fn new(policy: Policy) -> Self {
        Self { policy }
    }
}

impl<S> tower::Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorize { inner, policy: self.policy.clone() }
    }
}
