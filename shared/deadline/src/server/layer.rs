use std::sync::Arc;

use tower::Layer;

use super::DeadlineService;
use crate::HopStats;

/// Applies [`DeadlineService`] for one hop; all requests share its [`HopStats`].
#[derive(Debug, Clone)]
pub struct DeadlineLayer<P> {
    name: &'static str,
    protocol: P,
    stats: Arc<HopStats>,
}

impl<P> DeadlineLayer<P> {
    pub fn new(name: &'static str, protocol: P, stats: Arc<HopStats>) -> Self {
        Self { name, protocol, stats }
    }
}

impl<S, P: Clone> Layer<S> for DeadlineLayer<P> {
    type Service = DeadlineService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService::new(inner, self.name, self.protocol.clone(), self.stats.clone())
    }
}
