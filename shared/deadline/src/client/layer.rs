use tower::Layer;

use super::ForwardDeadline;
use crate::ForwardPolicy;

/// Applies [`ForwardDeadline`] toward one named dependency.
#[derive(Debug, Clone)]
pub struct ForwardDeadlineLayer {
    dependency: &'static str,
    policy: ForwardPolicy,
}

impl ForwardDeadlineLayer {
    pub fn new(dependency: &'static str, policy: ForwardPolicy) -> Self {
        Self { dependency, policy }
    }
}

impl<S> Layer<S> for ForwardDeadlineLayer {
    type Service = ForwardDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ForwardDeadline::new(inner, self.dependency, self.policy)
    }
}
