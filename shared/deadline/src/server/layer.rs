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
    at_edge: bool,
}

impl<P> DeadlineLayer<P> {
    pub fn new(name: &'static str, protocol: P, stats: Arc<HopStats>) -> Self {
        Self {
            name,
            protocol,
            stats,
            at_edge: false,
        }
    }

    /// See [`DeadlineService::at_edge`].
    pub fn at_edge(mut self) -> Self {
        self.at_edge = true;
        self
    }
}

impl<S, P: Clone> Layer<S> for DeadlineLayer<P> {
    type Service = DeadlineService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        let service =
            DeadlineService::new(inner, self.name, self.protocol.clone(), self.stats.clone());
        if self.at_edge {
            service.at_edge()
        } else {
            service
        }
    }
}
