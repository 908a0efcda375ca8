//! Where spans and metrics go over OTLP, read from the standard `OTEL_EXPORTER_OTLP_*` variables:
//! gRPC or `http/protobuf`, TLS when the endpoint is `https://`.

use std::path::PathBuf;

use rustls::pki_types::{CertificateDer, pem::PemObject};

use opentelemetry_otlp::{
    MetricExporter, SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use tonic::transport::{Certificate, ClientTlsConfig};

use crate::TelemetryError;

/// One signal's OTLP export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Otlp {
    /// The collector: for gRPC its address (`http://collector:4317`); for `http/protobuf` the
    /// signal's own URL (`http://collector:4318/v1/traces`). `https://` exports over TLS.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// A PEM file of CA certificates trusted for the collector's, besides the public roots.
    pub ca_file: Option<PathBuf>,
}

/// The OTLP transport (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtlpProtocol {
    /// `grpc`: OTLP/gRPC, usually on port 4317.
    #[default]
    Grpc,
    /// `http/protobuf`: OTLP/HTTP with protobuf bodies, usually on port 4318.
    HttpProtobuf,
}

/// The signals, as the variables and OTLP/HTTP paths name them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Traces => "TRACES",
            Signal::Metrics => "METRICS",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Signal::Traces => "/v1/traces",
            Signal::Metrics => "/v1/metrics",
        }
    }
}

impl Otlp {
    /// OTLP/gRPC to `endpoint`, trusting the public roots only.
    pub fn grpc(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            protocol: OtlpProtocol::Grpc,
            ca_file: None,
        }
    }

    /// `signal`'s export as `read` (the environment) configures it, or `None` without an
    /// endpoint. Each `OTEL_EXPORTER_OTLP_<SIGNAL>_*` variable wins over its `OTEL_EXPORTER_OTLP_*`
    /// counterpart; a shared `http/protobuf` endpoint gets the signal's path appended, a
    /// signal's own is used as it is (as the OTLP exporter specification says).
    pub(crate) fn from_env(
        signal: Signal,
        read: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TelemetryError> {
        let setting = |name: &str| {
            read(&format!("OTEL_EXPORTER_OTLP_{}_{name}", signal.name()))
                .or_else(|| read(&format!("OTEL_EXPORTER_OTLP_{name}")))
        };
        let protocol = match setting("PROTOCOL").as_deref() {
            None | Some("grpc") => OtlpProtocol::Grpc,
            Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
            Some(other) => {
                return Err(TelemetryError(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL {other:?}: must be grpc or http/protobuf"
                )));
            }
        };
        let own = read(&format!("OTEL_EXPORTER_OTLP_{}_ENDPOINT", signal.name()));
        let endpoint = match (own, read("OTEL_EXPORTER_OTLP_ENDPOINT"), protocol) {
            (Some(own), _, _) => own,
            (None, Some(shared), OtlpProtocol::HttpProtobuf) => {
                format!("{}{}", shared.trim_end_matches('/'), signal.path())
            }
            (None, Some(shared), OtlpProtocol::Grpc) => shared,
            (None, None, _) => return Ok(None),
        };
        Ok(Some(Self {
            endpoint,
            protocol,
            ca_file: setting("CERTIFICATE").map(PathBuf::from),
        }))
    }

    pub(crate) fn span_exporter(&self) -> Result<SpanExporter, TelemetryError> {
        let built = match self.protocol {
            OtlpProtocol::Grpc => self.tonic(SpanExporter::builder().with_tonic())?.build(),
            OtlpProtocol::HttpProtobuf => SpanExporter::builder()
                .with_http()
                .with_endpoint(&self.endpoint)
                .with_http_client(self.http_client()?)
                .build(),
        };
        built.map_err(|error| TelemetryError(error.to_string()))
    }

    pub(crate) fn metric_exporter(&self) -> Result<MetricExporter, TelemetryError> {
        let built = match self.protocol {
            OtlpProtocol::Grpc => self.tonic(MetricExporter::builder().with_tonic())?.build(),
            OtlpProtocol::HttpProtobuf => MetricExporter::builder()
                .with_http()
                .with_endpoint(&self.endpoint)
                .with_http_client(self.http_client()?)
                .build(),
        };
        built.map_err(|error| TelemetryError(error.to_string()))
    }

    fn ca_pem(&self) -> Result<Option<Vec<u8>>, TelemetryError> {
        self.ca_file
            .as_ref()
            .map(|path| {
                std::fs::read(path).map_err(|error| {
                    TelemetryError(format!(
                        "OTEL_EXPORTER_OTLP_CERTIFICATE {}: {error}",
                        path.display()
                    ))
                })
            })
            .transpose()
    }

    /// `builder` to the endpoint; over TLS for `https://`, trusting the public roots and the CA
    /// file's certificates.
    fn tonic<B: WithExportConfig + WithTonicConfig>(
        &self,
        builder: B,
    ) -> Result<B, TelemetryError> {
        let builder = builder.with_endpoint(&self.endpoint);
        if !self.endpoint.starts_with("https://") {
            return Ok(builder);
        }
        let tls = ClientTlsConfig::new().with_webpki_roots();
        Ok(builder.with_tls_config(match self.ca_pem()? {
            Some(pem) => tls.ca_certificate(Certificate::from_pem(pem)),
            None => tls,
        }))
    }

    /// The batch exporters send from a thread of their own, outside any async runtime: a blocking
    /// client, built on a thread of its own too (building one inside the runtime panics).
    fn http_client(&self) -> Result<otlp_http_client::blocking::Client, TelemetryError> {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        if let Some(pem) = self.ca_pem()? {
            for certificate in CertificateDer::pem_slice_iter(&pem) {
                let certificate = certificate.map_err(|error| {
                    TelemetryError(format!("OTEL_EXPORTER_OTLP_CERTIFICATE: {error}"))
                })?;
                roots.add(certificate).map_err(|error| {
                    TelemetryError(format!("OTEL_EXPORTER_OTLP_CERTIFICATE: {error}"))
                })?;
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(
            rustls::crypto::ring::default_provider().into(),
        )
        .with_safe_default_protocol_versions()
        .map_err(|error| TelemetryError(error.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        std::thread::spawn(move || {
            otlp_http_client::blocking::Client::builder()
                .tls_backend_preconfigured(tls)
                .build()
        })
        .join()
        .map_err(|_| TelemetryError("the thread building the OTLP/HTTP client panicked".into()))?
        .map_err(|error| TelemetryError(format!("the OTLP/HTTP client: {error}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_from(
        variables: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<String> {
        move |name| {
            variables
                .iter()
                .find(|(variable, _)| *variable == name)
                .map(|(_, value)| (*value).to_owned())
        }
    }

    fn traces(
        variables: &'static [(&'static str, &'static str)],
    ) -> Result<Option<Otlp>, TelemetryError> {
        Otlp::from_env(Signal::Traces, &read_from(variables))
    }

    #[test]
    fn without_an_endpoint_nothing_is_exported() {
        assert_eq!(
            traces(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap(),
            None
        );
    }

    #[test]
    fn grpc_is_the_default_and_its_endpoint_is_used_as_given() {
        let otlp = traces(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317")]).unwrap();
        assert_eq!(otlp, Some(Otlp::grpc("https://collector:4317")));
    }

    #[test]
    fn a_shared_http_endpoint_gets_the_signals_path_and_a_signals_own_is_used_as_given() {
        const SHARED: &[(&str, &str)] = &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ];
        let otlp = traces(SHARED).unwrap().unwrap();
        assert_eq!(
            (otlp.endpoint.as_str(), otlp.protocol),
            (
                "http://collector:4318/v1/traces",
                OtlpProtocol::HttpProtobuf
            )
        );
        let metrics = Otlp::from_env(Signal::Metrics, &read_from(SHARED))
            .unwrap()
            .unwrap();
        assert_eq!(metrics.endpoint, "http://collector:4318/v1/metrics");

        let own = traces(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:9999/ingest",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ]);
        assert_eq!(own.unwrap().unwrap().endpoint, "http://traces:9999/ingest");
    }

    #[test]
    fn a_signals_own_settings_win_over_the_shared_ones() {
        let otlp = traces(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/certs/shared.pem"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/certs/traces.pem"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            otlp,
            Otlp {
                endpoint: "http://collector:4318".into(),
                protocol: OtlpProtocol::Grpc,
                ca_file: Some("/certs/traces.pem".into())
            }
        );
    }

    #[test]
    fn an_unknown_protocol_is_refused_by_name() {
        let error = traces(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ])
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("\"http/json\": must be grpc or http/protobuf"),
            "{error}"
        );
    }
}
