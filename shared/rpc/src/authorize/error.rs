/// Why a call was refused before it reached the service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "no client certificate: this service answers only the chain's services and its operator"
    )]
    NoCertificate,
    #[error("{caller} may not call {path}")]
    NotAllowed { caller: String, path: String },
}

impl From<&Refusal> for tonic::Status {
    fn from(refusal: &Refusal) -> Self {
        match refusal {
            Refusal::NoCertificate => tonic::Status::unauthenticated(refusal.to_string()),
            Refusal::NotAllowed { .. } => tonic::Status::permission_denied(refusal.to_string()),
        }
    }
}
