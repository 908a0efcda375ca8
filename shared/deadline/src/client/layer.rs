use std::sync::Arc;

use tower::Layer;

use super::ForwardDeadline;
use crate::{ForwardPolicy, LatencyEstimate};

/// Applies [`ForwardDeadline`] toward one named dependency.
#[derive(Debug, Clone)]
pub struct ForwardDeadlineLayer {
    dependency: &'static str,
    policy: ForwardPolicy,
    estimate: Option<Arc<LatencyEstimate>>,
}

impl ForwardDeadlineLayer {
    pub fn new(dependency: &'static str, policy: ForwardPolicy) -> Self {
        Self {
            dependency,
            policy,
            estimate: None,
        }
    }

    /// Also keeps `estimate` of the dependency's answers, and fails fast on it.
    pub fn with_estimate(self, estimate: Arc<LatencyEstimate>) -> Self {
        Self {
            estimate: Some(estimate),
            ..self
        }
    }
}

impl<S> Layer<S> for ForwardDeadlineLayer {
    type Service = ForwardDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ForwardDeadline {
            inner,
            dependency: self.dependency,
            policy: self.policy,
            estimate: self.estimate.clone(),
        }
    }
}
