use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
};

use deadline::Hop;
use tonic::{Request, metadata::MetadataMap};

/// One gRPC call that can be sent again: the message and metadata kept apart, because a
/// `tonic::Request` (and the HTTP request under it) cannot be cloned; and the hop whose deadline
/// every attempt shares.
#[derive(Debug, Clone)]
pub struct Call<M> {
    pub message: M,
    pub metadata: MetadataMap,
    pub hop: Arc<Hop>,
    /// Attempts made before this one (0 for the first).
    pub previous_attempts: u32,
    /// The replicas the attempts went to, shared by every attempt of the call.
    pub previous_replicas: PreviousReplicas,
}

impl<M> Call<M> {
    pub fn new(message: M, metadata: MetadataMap, hop: Arc<Hop>) -> Self {
        Self {
            message,
            metadata,
            hop,
            previous_attempts: 0,
            previous_replicas: PreviousReplicas::default(),
        }
    }

    /// The request for this attempt, under the call's hop, numbered in
    /// `grpc-previous-rpc-attempts` when it is a retry, and carrying the replicas tried before,
    /// for the balancer to choose another.
    pub fn into_request(self) -> Request<M> {
        let mut metadata = self.metadata;
        if self.previous_attempts > 0 {
            metadata.insert(wire::PREVIOUS_ATTEMPTS, self.previous_attempts.into());
        }
        let mut request = Request::from_parts(metadata, Default::default(), self.message);
        request.extensions_mut().insert(self.previous_replicas);
        self.hop.attach(request.extensions_mut());
        request
    }
}

/// The replicas of the dependency that earlier attempts of one call went to: a request
/// extension the balancer reads, so that a retry goes to another replica where there is one
/// (Envoy's "previous hosts" retry predicate), and writes, recording each attempt's choice.
#[derive(Debug, Clone, Default)]
pub struct PreviousReplicas(Arc<Mutex<Vec<SocketAddr>>>);

impl PreviousReplicas {
    /// Whether an earlier attempt went to `replica`.
    pub fn contains(&self, replica: SocketAddr) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&replica)
    }

    /// Records that an attempt goes to `replica`.
    pub fn push(&self, replica: SocketAddr) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(replica);
    }
}
