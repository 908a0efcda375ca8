//! The Kubernetes manifests of `deploy/kubernetes/`, checked without a cluster: both overlays
//! render (`kubectl kustomize`), every object validates against the Kubernetes schemas
//! (`kubernetes-validate`), `checkov` finds no failed check (each skip carries its reason in the
//! manifest), and every setting a manifest passes to a service is one the service reads. The
//! three tools are installed by `.ci/run`; without them the test fails in CI and elsewhere says
//! so and stops.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use test_support::{missing, setting_key, unread_setting};

/// The Kubernetes version the manifests are written for (native `sleep` pre-stop hooks, gRPC probes).
const KUBERNETES_VERSION: &str = "1.32.0";

fn overlay(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes/overlays")
        .join(name)
}

/// Runs `program` with `args`; `None` (after saying so) when the program is not installed.
fn run(program: &str, args: &[&str]) -> Option<std::process::Output> {
    match Command::new(program).args(args).output() {
        Ok(output) => Some(output),
        Err(error) => {
            missing(
                &format!("{program} ({error})"),
                "the Kubernetes manifests were not checked",
            );
            None
        }
    }
}

fn succeeded(program: &str, output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{program} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The settings a rendered manifest passes as environment variables, `(variable, value)`; the
/// value is `None` when it comes from a Secret.
fn environment(rendered: &str) -> Vec<(String, Option<String>)> {
    let lines: Vec<&str> = rendered.lines().map(str::trim).collect();
    lines
        .iter()
        .enumerate()
        .filter_map(|(at, line)| {
            let name = line.strip_prefix("- name: ")?;
            let value = lines
                .get(at + 1)
                .and_then(|next| next.strip_prefix("value: "))
                .map(|value| value.trim_matches('"').to_owned());
            Some((name.to_owned(), value))
        })
        .collect()
}

fn check_settings(rendered: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for (variable, value) in environment(rendered) {
        let unread = match () {
            () if variable.starts_with("GATEWAY_") => {
                setting_key("GATEWAY", &variable).and_then(|key| {
                    unread_setting::<gateway::Settings>("GATEWAY", &key, value.as_deref())
                })
            }
            () if variable.starts_with("ORDERS_") => {
                setting_key("ORDERS", &variable).and_then(|key| {
                    unread_setting::<orders::Settings>("ORDERS", &key, value.as_deref())
                })
            }
            () if variable.starts_with("PAYMENT_") => {
                setting_key("PAYMENT", &variable).and_then(|key| {
                    unread_setting::<payment::Settings>("PAYMENT", &key, value.as_deref())
                })
            }
            () if variable.starts_with("BANK_") => setting_key("BANK", &variable).and_then(|key| {
                unread_setting::<bank_mock::Settings>("BANK", &key, value.as_deref())
            }),
            () if variable.starts_with("WEBHOOK_SENDER_") => {
                setting_key("WEBHOOK_SENDER", &variable).and_then(|key| {
                    unread_setting::<webhook_sender::Settings>(
                        "WEBHOOK_SENDER",
                        &key,
                        value.as_deref(),
                    )
                })
            }
            () => None,
        };
        wrong.extend(unread.map(|why| format!("{variable}: {why}")));
    }
    wrong
}

#[test]
fn both_overlays_render_validate_and_pass_checkov() {
    let scratch = tempfile::tempdir().unwrap();
    for name in ["dev", "production"] {
        let Some(rendered) = run("kubectl", &["kustomize", overlay(name).to_str().unwrap()]) else {
            return;
        };
        succeeded("kubectl kustomize", &rendered);
        let text = String::from_utf8(rendered.stdout).unwrap();
        let file = scratch.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &text).unwrap();
        let file = file.to_str().unwrap();

        assert!(
            text.contains("name: default-deny"),
            "{name}: the default-deny policy is rendered"
        );
        let wrong = check_settings(&text);
        assert!(
            wrong.is_empty(),
            "{name}: settings the services do not read:\n{}",
            wrong.join("\n")
        );

        let Some(validated) = run(
            "kubernetes-validate",
            &["--strict", "--quiet", "-k", KUBERNETES_VERSION, file],
        ) else {
            return;
        };
        succeeded("kubernetes-validate", &validated);
        let Some(checked) = run(
            "checkov",
            &[
                "-f",
                file,
                "--framework",
                "kubernetes",
                "--compact",
                "--quiet",
                "--skip-download",
            ],
        ) else {
            return;
        };
        succeeded("checkov", &checked);
    }
}

/// The optional components render on top of an overlay: cert-manager's Certificates make exactly
/// the Secrets the pods mount, each naming its service as the others check it, and the
/// collector's component points the services' spans at itself.
#[test]
fn the_components_render_and_issue_the_secrets_the_pods_mount() {
    let scratch = tempfile::tempdir().unwrap();
    // kustomize takes directories by relative path only.
    let up = "../".repeat(scratch.path().components().count() - 1);
    let kubernetes = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes")
        .canonicalize()
        .unwrap();
    let relative = |path: &str| {
        format!(
            "{up}{}",
            kubernetes.join(path).strip_prefix("/").unwrap().display()
        )
    };
    let kustomization = format!(
        // The namespace, as the overlay a user adds components to gives it to them too.
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: chain-dev\nresources: [{}]\ncomponents: [{}, {}, {}]\n",
        relative("overlays/dev"),
        relative("components/cert-manager"),
        relative("components/pod-monitor"),
        relative("components/otel-collector"),
    );
    std::fs::write(scratch.path().join("kustomization.yaml"), kustomization).unwrap();
    let Some(rendered) = run(
        "kubectl",
        &[
            "kustomize",
            "--load-restrictor",
            "LoadRestrictionsNone",
            scratch.path().to_str().unwrap(),
        ],
    ) else {
        return;
    };
    succeeded("kubectl kustomize", &rendered);
    let text = String::from_utf8(rendered.stdout).unwrap();
    assert!(text.contains("kind: PodMonitor"), "{text}");
    // The collector in the chain's namespace: the services' endpoint and their egress point at it.
    assert!(
        text.contains("OTEL_EXPORTER_OTLP_ENDPOINT: http://otel-collector:4317"),
        "{text}"
    );
    assert!(
        !text.contains("observability"),
        "nothing left pointing at another namespace's collector"
    );
    assert!(
        text.matches("name: otel-collector\n").count() >= 3,
        "its ConfigMap, Deployment and Service: {text}"
    );
    for service in rpc::dev_certs::SERVICES {
        let secret = format!("secretName: {service}-tls");
        assert_eq!(
            text.matches(&secret).count(),
            2,
            "{service}: mounted by its pods and issued by its Certificate"
        );
        assert!(
            text.contains(&format!("- {}", rpc::tls::dns_name(service))),
            "{service}'s Certificate names {}",
            rpc::tls::dns_name(service)
        );
    }
    // The components' own resources hold to the same rules as the chain's (their custom kinds
    // have no schema kubernetes-validate knows; checkov reads them all).
    let file = scratch.path().join("with-components.yaml");
    std::fs::write(&file, &text).unwrap();
    let Some(checked) = run(
        "checkov",
        &[
            "-f",
            file.to_str().unwrap(),
            "--framework",
            "kubernetes",
            "--compact",
            "--quiet",
            "--skip-download",
        ],
    ) else {
        return;
    };
    succeeded("checkov", &checked);
}
