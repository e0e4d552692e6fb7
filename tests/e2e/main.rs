//! End-to-end tests: the `allot` binary as users and operators run it, against a real
//! nats-server, SQLite on disk and real processes (signals included).

mod api_fuzz;
mod audit;
mod cluster;
mod costs;
mod dashboard;
mod deadlines;
mod faults;
mod gateway_crash;
mod gpu_check;
mod inventory_crash;
mod k8s;
mod nats_configs;
mod pipelines;
mod predict;
mod quickstart;
mod quotas;
mod readme;
mod remediation;
mod replay;
mod replicas;
mod scale;
mod stress;
mod submit;
mod submit_wait;
mod support;
mod tokens;
mod up_auth;
mod up_lifecycle;
mod up_status;
mod workloads;
