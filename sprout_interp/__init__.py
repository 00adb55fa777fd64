"""sprout_interp: interpretability toolkit for Sprout, the course's small GPT."""
from sprout_interp import features as sae  # si.sae.load_sae(m, 3), si.sae.feature_summary(m, sae, f)
from sprout_interp.behaviour.compare import compare_models
from sprout_interp.behaviour.knockout import block_knockout
from sprout_interp.behaviour.steering import (
    steered,
    steered_generations,
    steering_controls,
    steering_effect,
    steering_layers,
    steering_vector,
)
from sprout_interp.circuits import (
    metrics,  # si.metrics.LogitDiff / LogProb / Loss / TargetLogProb: one metric protocol
    patching,  # si.patching.activation_patch(model, clean, corrupted, metric, site=..., by=...)
)
from sprout_interp.circuits.ablation import ablate, ablation_sweep, attribution_sweep
from sprout_interp.circuits.attention import attention_patterns, head_scores
from sprout_interp.circuits.attribution import direct_logit_attribution, head_token_effects
from sprout_interp.circuits.attribution_graph import attribution_graph
from sprout_interp.circuits.composition import composition_scores, composition_table
from sprout_interp.circuits.graph_json import GraphJSON, load_graph_json, save_graph_json
from sprout_interp.circuits.graph_labels import graph_labels
from sprout_interp.circuits.graphs import AttributionGraph, graph_scores, load_graph, prune_graph
from sprout_interp.circuits.head_loadings import edge_heads, head_loadings
from sprout_interp.circuits.induction import find_induction_circuit
from sprout_interp.circuits.ov_circuit import full_ov_circuit, ov_copying_scores
from sprout_interp.circuits.qk_attribution import QKAttribution, qk_attribution
from sprout_interp.circuits.subgraph import node_edges, node_keys, subgraph
from sprout_interp.core.errors import (
    AblationError,
    ArgumentError,
    AttributionGraphError,
    CheckpointNotFoundError,
    ContextLengthError,
    ExportError,
    HookNameError,
    HookOutputError,
    InvalidConfigError,
    InvalidWeightsError,
    MetricError,
    MissingTokenizerError,
    NotACheckpointError,
    NotAPathError,
    PatchingError,
    QKAttributionError,
    SAEMismatchError,
    SAENotFoundError,
    SproutError,
    StateDictMismatchError,
    SteeringError,
    TokenizationError,
    TunedLensMismatchError,
    TunedLensNotFoundError,
    UnequalLengthsError,
    UnreadablePathError,
    UnsafeCheckpointError,
    VocabularyMismatchError,
)
from sprout_interp.core.hooked import HookedSprout, SproutCache, load_hooked
from sprout_interp.core.loading import LoadedCheckpoint, load_checkpoint
from sprout_interp.features import neurons  # si.neurons.neuron_attribution(m, text, " Pl"), si.neurons.neuron_summary(...)
from sprout_interp.features.labels import feature_labels
from sprout_interp.lens.logit_lens import (
    logit_lens,  # the function; the module: `from sprout_interp.lens.logit_lens import ...`
    trajectories,
)
from sprout_interp.lens.residual import residual_rms
from sprout_interp.lens.tuned_lens import TunedLens, load_tuned_lens, save_tuned_lens, train_tuned_lens

load = load_hooked  # si.load("gpt-4") -> HookedSprout

__all__ = [
    "load", "load_hooked", "HookedSprout", "SproutCache", "load_checkpoint", "LoadedCheckpoint", "sae", "neurons",
    "logit_lens", "trajectories", "TunedLens", "load_tuned_lens", "save_tuned_lens", "train_tuned_lens",
    "direct_logit_attribution", "head_token_effects", "patching", "metrics",
    "composition_scores", "composition_table", "full_ov_circuit", "ov_copying_scores",
    "steering_vector", "steered", "steering_effect", "steering_layers", "steering_controls", "steered_generations",
    "residual_rms", "attention_patterns", "head_scores", "find_induction_circuit",
    "ablate", "ablation_sweep", "attribution_sweep", "block_knockout", "compare_models",
    "attribution_graph", "AttributionGraph", "load_graph", "prune_graph", "graph_scores", "AttributionGraphError",
    "feature_labels", "graph_labels",
    "node_edges", "node_keys", "subgraph",
    "save_graph_json", "load_graph_json", "GraphJSON",
    "qk_attribution", "QKAttribution", "head_loadings", "edge_heads", "QKAttributionError",
    "SproutError", "AblationError", "ArgumentError", "CheckpointNotFoundError", "NotACheckpointError", "UnsafeCheckpointError",
    "StateDictMismatchError", "VocabularyMismatchError", "ContextLengthError", "HookNameError", "TokenizationError",
    "HookOutputError", "NotAPathError", "UnreadablePathError", "InvalidConfigError", "InvalidWeightsError",
    "MissingTokenizerError", "MetricError", "PatchingError", "SAEMismatchError", "SAENotFoundError", "TunedLensMismatchError",
    "TunedLensNotFoundError", "ExportError", "SteeringError", "UnequalLengthsError",
]
