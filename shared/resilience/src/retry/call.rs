use tonic::{Request, metadata::MetadataMap};

use crate::PREVIOUS_ATTEMPTS_HEADER;

/// One gRPC call that can be sent again: the message and metadata kept apart, because a
/// `tonic::Request` (and the HTTP request under it) cannot be cloned.
#[derive(Debug, Clone)]
pub struct Call<M> {
    pub message: M,
    pub metadata: MetadataMap,
    /// Attempts made before this one (0 for the first).
    pub previous_attempts: u32,
}

impl<M> Call<M> {
    pub fn new(message: M, metadata: MetadataMap) -> Self {
        Self { message, metadata, previous_attempts: 0 }
    }

    /// The request for this attempt, numbered in `grpc-previous-rpc-attempts` when it is a retry.
    pub fn into_request(self) -> Request<M> {
        let mut metadata = self.metadata;
        if self.previous_attempts > 0 {
            metadata.insert(PREVIOUS_ATTEMPTS_HEADER, self.previous_attempts.into());
        }
        Request::from_parts(metadata, Default::default(), self.message)
    }
}
