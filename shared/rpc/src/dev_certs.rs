//! A development CA made at start: a fresh CA and one certificate per service, written to a
//! directory, so that the local stack and the compose demo run with mutual TLS and no secret is
//! ever committed. Production installs its own files instead (see [`crate::tls::TlsSettings`]).

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::tls::{TlsSettings, dns_name};

/// The name of the operator's client certificate: health and reflection of every inner service,
/// for grpcurl-style tools.
pub const OPERATOR: &str = "operator";

/// The services of the chain that hold a certificate (the webhook sender calls none and serves
/// no gRPC methods).
pub const SERVICES: [&str; 4] = ["gateway", "orders", "payment", "bank-mock"];

/// The files of a generated development CA.
#[derive(Debug, Clone)]
pub struct DevCerts {
    dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum DevCertsError {
    #[error("making a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl DevCerts {
    /// Makes a new CA and a certificate with a key for each of `names` (service names, and
    /// [`OPERATOR`] for people), written into `dir` as `ca.pem`, `<name>.pem` and `<name>.key`
    /// (keys readable by their owner only). The CA's key is not kept: nothing can be signed later.
    pub fn generate(dir: &Path, names: &[&str]) -> Result<Self, DevCertsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "chain development CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_certificate = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let certs = Self {
            dir: dir.to_owned(),
        };
        write(&certs.ca(), ca_certificate.pem().as_bytes(), false)?;
        for name in names {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(vec![dns_name(name)])?;
            params.distinguished_name.push(DnType::CommonName, *name);
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let certificate = params.signed_by(&key, &issuer)?;
            write(&certs.cert(name), certificate.pem().as_bytes(), false)?;
            write(&certs.key(name), key.serialize_pem().as_bytes(), true)?;
        }
        Ok(certs)
    }

    /// The CA and certificates of every service and the operator in `dir`: those made by an
    /// earlier run when they are all there (so that services already running keep trusting each
    /// other when a demo stack is started again), otherwise new ones.
    pub fn generate_once(dir: &Path) -> Result<Self, DevCertsError> {
        let names: Vec<&str> = SERVICES.into_iter().chain([OPERATOR]).collect();
        let existing = Self {
            dir: dir.to_owned(),
        };
        let complete = existing.ca().exists()
            && names
                .iter()
                .all(|name| existing.cert(name).exists() && existing.key(name).exists());
        if complete {
            Ok(existing)
        } else {
            Self::generate(dir, &names)
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    /// The TLS settings of service `name`.
    pub fn settings(&self, name: &str) -> TlsSettings {
        TlsSettings {
            ca_file: Some(self.ca()),
            cert_file: Some(self.cert(name)),
            key_file: Some(self.key(name)),
            ..TlsSettings::default()
        }
    }
}

fn write(path: &Path, contents: &[u8], private: bool) -> Result<(), DevCertsError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    options
        .open(path)
        .and_then(|mut file| file.write_all(contents))
        .map_err(|source| DevCertsError::Write {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::ServiceTls;

    #[test]
    fn every_service_gets_a_certificate_that_names_it_and_a_second_run_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let certs = DevCerts::generate_once(dir.path()).unwrap();
        for name in SERVICES.into_iter().chain([OPERATOR]) {
            ServiceTls::load(name, &certs.settings(name)).unwrap();
        }
        let ca = std::fs::read(certs.ca()).unwrap();
        DevCerts::generate_once(dir.path()).unwrap();
        assert_eq!(
            std::fs::read(certs.ca()).unwrap(),
            ca,
            "the CA of the first run is kept"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(certs.key(OPERATOR))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "keys are readable by their owner only");
        }
    }
}
