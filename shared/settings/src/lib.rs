#![doc = include_str!("../README.md")]

use std::path::PathBuf;

use figment::{
    Figment,
    providers::{Env, Format, Serialized, Toml},
};
use serde::{Serialize, de::DeserializeOwned};

/// The settings flags every service binary accepts.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SettingsArgs {
    /// TOML file with settings (overrides the defaults).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// One setting as KEY=VALUE, KEY dotted as in the settings table of the README; overrides
    /// file and environment; repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
    #[error("--set {0:?} is not KEY=VALUE")]
    BadOverride(String),
    #[error("invalid settings: {}", one_line(.0))]
    Invalid(#[from] Box<figment::Error>),
}

/// Every error figment found, on one line (its own text puts each on a line of its own).
fn one_line(error: &figment::Error) -> String {
    error
        .clone()
        .into_iter()
        .map(|error| error.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Loads `T` from the four layers; `env_prefix` is e.g. `"ORDERS"`.
pub fn load<T>(env_prefix: &str, args: &SettingsArgs) -> Result<T, SettingsError>
where
    T: DeserializeOwned + Serialize + Default,
{
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = &args.config {
        if !path.exists() {
            return Err(SettingsError::MissingFile(path.clone()));
        }
        figment = figment.merge(Toml::file(path));
    }
    figment = figment
        .merge(Env::prefixed(&format!("{env_prefix}_")).split("__"))
        .merge(Toml::string(&overrides_as_toml(&args.overrides)?));
    figment
        .extract()
        .map_err(|error| SettingsError::Invalid(Box::new(error)))
}

/// `key=value` pairs as a TOML document; a value that is not valid TOML is taken as a string.
fn overrides_as_toml(overrides: &[String]) -> Result<String, SettingsError> {
    let mut document = String::new();
    for pair in overrides {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| SettingsError::BadOverride(pair.clone()))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(SettingsError::BadOverride(pair.clone()));
        }
        let value = if toml::from_str::<toml::Table>(&format!("v = {value}")).is_ok() {
            value.to_owned()
        } else {
            toml::Value::String(value.to_owned()).to_string()
        };
        document.push_str(&format!("{key} = {value}\n"));
    }
    Ok(document)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Nested {
        reserve_ms: u64,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Example {
        listen: String,
        payment: Nested,
    }

    impl Default for Example {
        fn default() -> Self {
            Self {
                listen: "127.0.0.1:1".into(),
                payment: Nested { reserve_ms: 200 },
            }
        }
    }

    fn args(config: Option<&str>, overrides: &[&str]) -> SettingsArgs {
        SettingsArgs {
            config: config.map(PathBuf::from),
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
        }
    }

    // figment's Jail closures return its large error type; that is its API, not ours.
    #[allow(clippy::result_large_err)]
    #[test]
    fn each_layer_overrides_the_one_before() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "svc.toml",
                "listen = \"file:1\"\n[payment]\nreserve_ms = 10\n",
            )?;
            let loaded: Example = load("SVC", &args(Some("svc.toml"), &[])).unwrap();
            assert_eq!(
                loaded,
                Example {
                    listen: "file:1".into(),
                    payment: Nested { reserve_ms: 10 }
                }
            );

            jail.set_env("SVC_PAYMENT__RESERVE_MS", "20");
            let loaded: Example = load("SVC", &args(Some("svc.toml"), &[])).unwrap();
            assert_eq!(loaded.payment.reserve_ms, 20);

            let loaded: Example = load(
                "SVC",
                &args(
                    Some("svc.toml"),
                    &["payment.reserve_ms=30", "listen=flag:1"],
                ),
            )
            .unwrap();
            assert_eq!(
                loaded,
                Example {
                    listen: "flag:1".into(),
                    payment: Nested { reserve_ms: 30 }
                }
            );
            Ok(())
        });
    }

    #[allow(clippy::result_large_err)]
    #[test]
    fn mistakes_are_errors_not_defaults() {
        figment::Jail::expect_with(|_| {
            assert!(matches!(
                load::<Example>("SVC", &args(Some("nope.toml"), &[])),
                Err(SettingsError::MissingFile(_))
            ));
            assert!(matches!(
                load::<Example>("SVC", &args(None, &["listen"])),
                Err(SettingsError::BadOverride(_))
            ));
            assert!(matches!(
                load::<Example>("SVC", &args(None, &["payment.reserve=1"])),
                Err(SettingsError::Invalid(_))
            ));
            assert!(matches!(
                load::<Example>("SVC", &args(None, &["payment.reserve_ms=soon"])),
                Err(SettingsError::Invalid(_))
            ));
            let unknown = load::<Example>("SVC", &args(None, &["payment.reserve=1"]))
                .unwrap_err()
                .to_string();
            assert!(
                !unknown.contains('\n') && unknown.contains("reserve"),
                "{unknown}"
            );
            Ok(())
        });
    }
}
