//! Gatehouse: library side of the binary, so end-to-end tests can start its parts in-process.

pub mod admin;
pub mod controller;
pub mod proxy;
pub mod run;
pub mod status_cmd;
pub mod telemetry;
