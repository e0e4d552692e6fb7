//! One process-wide metrics registry, encoded in the Prometheus text format.
//!
//! Every part of the process registers its metric families here, under the `allot_` prefix,
//! and keeps a handle to update them; [`encode`] renders them all. `allot run` serves that at
//! its ops port's `/metrics`, and under `allot up`, where every service shares the process,
//! one `/metrics` carries every service's metrics.
//!
//! Registration is by name and idempotent: registering a name that is already there returns
//! the family registered first (so two services in one process, or two tests, share one
//! family, and each service's series are told apart by their labels — a consumer's name, a
//! pool, a team). Families are registered once per process, lazily, by the module that owns
//! them (a `LazyLock` over [`register`]), so a family appears once its owner is first used.
//!
//! Naming follows Prometheus: base units, a counter's `_total` added by the encoder (register
//! `consumer_messages`, scrape `allot_consumer_messages_total`), a unit's suffix by
//! [`register_with_unit`] (`scheduling_pass_duration` in [`Unit::Seconds`] becomes
//! `allot_scheduling_pass_duration_seconds`).

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::{Metric, Registry, Unit};

/// The prefix of every metric's name.
pub const PREFIX: &str = "allot";

/// The `Content-Type` of [`encode`]'s output: the Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The registry and, by full name, a handle on every family in it.
struct Families {
    registry: Registry,
    by_name: HashMap<String, Box<dyn Any + Send + Sync>>,
}

fn families() -> MutexGuard<'static, Families> {
    static FAMILIES: OnceLock<Mutex<Families>> = OnceLock::new();
    FAMILIES
        .get_or_init(|| {
            Mutex::new(Families {
                registry: Registry::with_prefix(PREFIX),
                by_name: HashMap::new(),
            })
        })
        .lock()
        // A panic elsewhere while registering leaves the map whole: keep serving.
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Registers `metric` as `allot_<name>` with `help`, or, if a metric of that name is
/// registered already, returns that one and drops `metric`.
///
/// # Panics
///
/// If `name` was registered with another metric type: two owners disagree on what a name
/// means, which is a bug to find in the first test that meets it.
pub fn register<M>(name: &str, help: &str, metric: M) -> M
where
    M: Metric + Clone,
{
    register_as(name, help, None, metric)
}

/// [`register`] with a unit, which the encoder appends to the name (`_seconds`).
pub fn register_with_unit<M>(name: &str, help: &str, unit: Unit, metric: M) -> M
where
    M: Metric + Clone,
{
    register_as(name, help, Some(unit), metric)
}

fn register_as<M>(name: &str, help: &str, unit: Option<Unit>, metric: M) -> M
where
    M: Metric + Clone,
{
    let key = match &unit {
        Some(unit) => format!("{name}_{}", unit.as_str()),
        None => name.to_owned(),
    };
    let mut families = families();
    if let Some(known) = families.by_name.get(&key) {
        return known
            .downcast_ref::<M>()
            .unwrap_or_else(|| {
                panic!("metric {PREFIX}_{key} is registered twice with different types")
            })
            .clone();
    }
    match unit {
        Some(unit) => families
            .registry
            .register_with_unit(name, help, unit, metric.clone()),
        None => families.registry.register(name, help, metric.clone()),
    }
    families.by_name.insert(key, Box::new(metric.clone()));
    metric
}

/// Every registered metric, in the Prometheus text format ([`CONTENT_TYPE`]).
pub fn encode() -> String {
    let families = families();
    let mut text = String::new();
    prometheus_text::encode(&mut text, &families.registry)
        .expect("writing to a String does not fail");
    text
}

#[cfg(test)]
mod tests;
