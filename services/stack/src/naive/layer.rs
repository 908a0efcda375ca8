use tower::Layer;

use super::{NaiveRetry, NaiveSettings};

/// Applies [`NaiveRetry`].
#[derive(Debug, Clone, Copy)]
pub struct NaiveRetryLayer {
    settings: NaiveSettings,
}

impl NaiveRetryLayer {
    pub fn new(settings: NaiveSettings) -> Self {
        Self { settings }
    }
}

impl<S> Layer<S> for NaiveRetryLayer {
    type Service = NaiveRetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        NaiveRetry::new(inner, self.settings)
    }
}
