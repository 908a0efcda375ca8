use std::sync::Arc;

use tower::Layer;

use super::{Breaker, BreakerService};

/// Applies one dependency's [`Breaker`]; every service it makes shares it.
#[derive(Debug, Clone)]
pub struct BreakerLayer {
    breaker: Arc<Breaker>,
}

impl BreakerLayer {
    pub fn new(breaker: Arc<Breaker>) -> Self {
        Self { breaker }
    }
}

impl<S> Layer<S> for BreakerLayer {
    type Service = BreakerService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BreakerService::new(inner, self.breaker.clone())
    }
}
