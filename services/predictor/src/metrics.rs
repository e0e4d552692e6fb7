//! The predictor's metrics, in the process's registry ([`allot_runtime::metrics`]):
//! `allot_predictions_total{pool,basis}`, the predictions published (counted at their
//! PubAck), by what they rest on (`identity`, `team_gpus`, `declared`, … `default`: the fallback chain
//! of [`allot_predict::Basis`]), so a rising share of cold-start bases shows at a glance.

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use allot_runtime::metrics::register;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolBasis {
    pool: String,
    basis: &'static str,
}

static PREDICTIONS: LazyLock<Family<PoolBasis, Counter>> = LazyLock::new(|| {
    register(
        "predictions",
        "Run-time predictions published, by what they rest on",
        Family::default(),
    )
});

/// One more prediction for `pool` published, resting on `basis`.
pub(crate) fn published(pool: &str, basis: allot_predict::Basis) {
    PREDICTIONS
        .get_or_create(&PoolBasis {
            pool: pool.to_owned(),
            basis: basis.as_str(),
        })
        .inc();
}
