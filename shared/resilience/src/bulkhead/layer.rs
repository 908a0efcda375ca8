use std::sync::Arc;

use tower::Layer;

use super::{Bulkhead, BulkheadService};

/// Applies one dependency's [`Bulkhead`]; every service it makes shares its permits.
#[derive(Debug, Clone)]
pub struct BulkheadLayer {
    bulkhead: Arc<Bulkhead>,
}

impl BulkheadLayer {
    pub fn new(bulkhead: Arc<Bulkhead>) -> Self {
        Self { bulkhead }
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = BulkheadService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BulkheadService::new(inner, self.bulkhead.clone())
    }
}
