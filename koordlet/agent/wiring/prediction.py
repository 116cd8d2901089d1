"""The peak predictor: its configuration from the flags, the predict server, and the prod prediction it hands
the NodeMetric reporter."""

from __future__ import annotations

from collections.abc import Sequence

from koordlet.agent.context import AgentContext, Component
from koordlet.api.pod import PodMeta
from koordlet.config import KoordletConfig
from koordlet.prediction.predictor import ProdPrediction, predict_prod
from koordlet.prediction.server import PredictionConfig, PredictServer
from koordlet.reporters.nodemetric import ProdPredict


def prediction_config(config: KoordletConfig) -> PredictionConfig:
    return PredictionConfig(
        checkpoint_dir=config.prediction_checkpoint_filepath,
        cold_start_s=config.prediction_cold_start_duration_s,
        safety_margin_percent=config.prediction_safety_margin_percent,
        memory_half_life_s=config.prediction_memory_histogram_decay_halflife_s,
        cpu_half_life_s=config.prediction_cpu_histogram_decay_halflife_s,
        training_interval_s=config.prediction_training_interval_s,
        model_expiration_s=config.prediction_model_expiration_duration_s,
        checkpoint_interval_s=config.prediction_model_checkpoint_interval_s,
        checkpoint_max_per_step=config.prediction_model_checkpoint_max_per_step,
    )


def predict_server(ctx: AgentContext) -> Component | None:
    """The peak predictor (Koordinator starts it after the metrics advisor, before the qos manager): histograms
    of usage, restored from and saved to checkpoints; NodeMetric's prod reclaimable and prod peak."""
    states = ctx.states
    server = ctx.predictor = PredictServer(prediction_config(ctx.config), states.pods, ctx.cache, states.has_synced)
    return server


def prod_prediction(ctx: AgentContext) -> ProdPredict | None:
    """The prod prediction of each NodeMetric build, recorded in the prediction metrics as it is made."""
    server, states, metrics = ctx.predictor, ctx.states, ctx.metrics
    if server is None:
        return None
    config = server.config

    def predict(pods: Sequence[PodMeta], now: float) -> ProdPrediction:
        prediction = predict_prod(pods, states.node(), server.prediction, now, config.cold_start_s,
                                  config.safety_margin_percent)
        metrics.observe_prediction(prediction.by_predictor, prediction.reclaimable)
        return prediction

    return predict
