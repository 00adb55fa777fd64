"""Features: sparse autoencoders (SAEs) on Sprout's residual stream and what their latents mean. The SAE and its
SAELens-format files (``sae``), activation collection and the TopK training recipe of Gao et al. 2024
(``train``), quality metrics on held-out text (``metrics``), running the model with a layer's stream replaced by
the reconstruction or with one feature clamped (``splice``), feature pages -- top contexts, histogram,
promoted tokens, a short description (``pages``) -- the feed-forward's own neurons with the same pages, their
direct effect on a prediction and their ablation (``neurons``), and the search for features tied to the chapter's story
(``search``); text longer than the context is cut with a notice (``inputs``). Per-layer transcoders
(feed-forward input to output) in circuit-tracer's format (``transcoder``), their training
(``transcoder_train``) and quality, alone and as a replacement model (``transcoder_metrics``); a short measured label
for every transcoder feature, shipped beside each set (``labels``). Tensors or
text in, tensors or DataFrames out; no plotting.

May import: ``sprout_interp.core``, ``sprout_interp.lens``, ``sprout_interp.circuits`` and modules of this package.
"""

from sprout_interp.features.inputs import TruncatedTextWarning, feature_input
from sprout_interp.features.labels import feature_labels
from sprout_interp.features.metrics import feature_density, sae_quality
from sprout_interp.features.neurons import (
    NeuronIndex,
    NeuronSummary,
    ablate_neurons,
    index_neurons,
    neuron_attribution,
    neuron_on_text,
    neuron_summary,
    neuron_table,
    neurons_for_token,
)
from sprout_interp.features.pages import (
    FeatureIndex,
    FeatureSummary,
    feature_summary,
    features_for_token,
    features_on_text,
    index_features,
)
from sprout_interp.features.sae import SparseAutoencoder, available_saes, load_sae, read_sae, save_sae
from sprout_interp.features.search import (
    name_copying_with_features,
    previous_token_features,
    rate_matched_controls,
    second_name_features,
)
from sprout_interp.features.splice import run_with_sae_cache, run_with_saes, spliced
from sprout_interp.features.train import collect_activations, train_sae
from sprout_interp.features.transcoder import Transcoder, TranscoderSet, load_transcoders, save_transcoders
from sprout_interp.features.transcoder_metrics import replacement_quality, run_with_transcoders, transcoder_quality
from sprout_interp.features.transcoder_train import train_transcoder

__all__ = [
    "SparseAutoencoder", "load_sae", "save_sae", "read_sae", "available_saes", "collect_activations", "train_sae",
    "sae_quality", "feature_density", "spliced", "run_with_saes", "run_with_sae_cache", "FeatureIndex",
    "FeatureSummary", "index_features", "feature_summary", "features_on_text", "features_for_token",
    "second_name_features", "previous_token_features", "name_copying_with_features", "rate_matched_controls",
    "feature_input",
    "TruncatedTextWarning",
    "NeuronIndex", "NeuronSummary", "index_neurons", "neuron_summary", "neuron_table", "neurons_for_token",
    "neuron_attribution", "ablate_neurons", "neuron_on_text",
    "Transcoder", "TranscoderSet", "load_transcoders", "save_transcoders", "train_transcoder", "transcoder_quality",
    "replacement_quality", "run_with_transcoders", "feature_labels",
]
