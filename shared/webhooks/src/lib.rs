#![doc = include_str!("../README.md")]

pub mod dedupe;
pub mod signature;
pub mod ssrf;
