//! A CA of the tests' own which, unlike the development CA, keeps its key: it signs the renewed
//! certificates of tests that rotate them.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

pub struct TestCa {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new() -> Self {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = params
            .self_signed(&key)
            .expect("the CA's certificate")
            .pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA's certificate, in PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// Writes a new certificate naming `dns_name` to `cert` and its new key to `key` (PEM),
    /// returning the certificate in DER.
    pub fn issue(&self, dns_name: &str, cert: &Path, key: &Path) -> Vec<u8> {
        let key_pair = KeyPair::generate().expect("a key");
        let certificate = CertificateParams::new(vec![dns_name.to_owned()])
            .expect("a name")
            .signed_by(&key_pair, &self.issuer)
            .expect("signed");
        std::fs::write(cert, certificate.pem()).expect("the certificate written");
        std::fs::write(key, key_pair.serialize_pem()).expect("the key written");
        certificate.der().to_vec()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}
