"""circuit-tracer's side of scripts/compare_circuit_tracer.py; runs under .venv-ct/bin/python, never the main venv.

    .venv-ct/bin/python scripts/circuit_tracer_worker.py MODEL_FOLDER TRANSCODER_FOLDER OUT_FOLDER [--threads N]

MODEL_FOLDER is ``to_hf()``'s export saved with ``save_pretrained`` (Qwen3ForCausalLM and a
PreTrainedTokenizerFast); TRANSCODER_FOLDER holds either per-layer transcoders (our ``layer_{i}.safetensors`` files
and ``config.yaml``, a JSON object: ``k``, ``feature_input_hook``, ``feature_output_hook``), which become
circuit-tracer's ``SingleLayerTranscoder`` with its ``TopK(k)`` activation (its own file loader,
``load_relu_transcoder``, knows ReLU and JumpReLU only) in a ``TranscoderSet``; or a cross-layer transcoder
(``config.yaml``'s ``model_kind`` is ``cross_layer_transcoder``; ``W_enc_{i}`` / ``W_dec_{i}`` files), read by
circuit-tracer's own ``load_clt`` (JumpReLU, decoders read eagerly). The model is
``ReplacementModel.from_pretrained_and_transcoders`` with the nnsight backend, float32, on the CPU, loaded once.

Then one request per line on stdin, a JSON object ``{"name", "ids", "batch_size", "max_n_logits",
"desired_logit_prob", "max_feature_nodes", "save"}``; each answered by one JSON line on stdout: the seconds
``attribute`` took (the whole call: its forward passes, backward passes and graph), and with ``save`` the file
``OUT/{name}.safetensors``
holding the graph (``adjacency``, ``active_features`` (n, 3) = layer, pos, feature, ``selected_features``,
``activation_values``, ``input_tokens``, ``logit_ids``, ``logit_probabilities``) and, in the reply,
``compute_graph_scores``' (replacement, completeness). An empty line or end of input ends it. Everything else
the libraries print goes to stderr, so stdout carries the replies only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def load(model_folder: str, tc_folder: str):
    import torch
    from circuit_tracer import ReplacementModel
    from circuit_tracer.transcoder.activation_functions import TopK
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
    from safetensors.torch import load_file

    cfg = json.loads((Path(tc_folder) / "config.yaml").read_text())
    if cfg.get("model_kind") == "cross_layer_transcoder":
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

        clt = load_clt(tc_folder, feature_input_hook=cfg["feature_input_hook"],
                       feature_output_hook=cfg["feature_output_hook"], scan=cfg.get("scan"),
                       device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False)
        return ReplacementModel.from_pretrained_and_transcoders(model_folder, clt, backend="nnsight",
                                                                device=torch.device("cpu"), dtype=torch.float32)
    transcoders = {}
    for layer, name in enumerate(cfg["transcoders"]):
        sd = {k: v.float() for k, v in load_file(str(Path(tc_folder) / name)).items()}
        d_tc, d_model = sd["W_enc"].shape
        k = ((cfg.get("sprout") or {}).get("layers") or {}).get(str(layer), {}).get("k", cfg["k"])  # a layer's own k
        tc = SingleLayerTranscoder(d_model, d_tc, TopK(int(k)), layer, skip_connection="W_skip" in sd,
                                   device=torch.device("cpu"), dtype=torch.float32)
        tc.load_state_dict(sd)
        transcoders[layer] = tc
    ts = TranscoderSet(transcoders, feature_input_hook=cfg["feature_input_hook"],
                       feature_output_hook=cfg["feature_output_hook"], scan=cfg.get("scan"))
    return ReplacementModel.from_pretrained_and_transcoders(model_folder, ts, backend="nnsight",
                                                            device=torch.device("cpu"), dtype=torch.float32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_folder")
    p.add_argument("transcoder_folder")
    p.add_argument("out_folder")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    reply = os.fdopen(os.dup(1), "w")  # the replies' own channel; fd 1 (print, tqdm, warnings) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import torch
    from circuit_tracer import attribute
    from circuit_tracer.graph import compute_graph_scores
    from safetensors.torch import save_file

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    model = load(a.model_folder, a.transcoder_folder)
    reply.write(json.dumps({"ready": True, "load_seconds": time.perf_counter() - t0,
                            "torch": torch.__version__, "threads": torch.get_num_threads()}) + "\n")
    reply.flush()
    out = Path(a.out_folder)
    for line in sys.stdin:
        if not line.strip():
            break
        req = json.loads(line)
        ids = torch.tensor(req["ids"], dtype=torch.long)
        t0 = time.perf_counter()
        graph = attribute(ids, model, max_n_logits=req["max_n_logits"],
                          desired_logit_prob=req["desired_logit_prob"], batch_size=req["batch_size"],
                          max_feature_nodes=req.get("max_feature_nodes"))
        seconds = time.perf_counter() - t0
        ans = {"name": req["name"], "seconds": seconds}
        if req.get("save"):
            f = out / f"{req['name']}.safetensors"
            save_file({
                "adjacency": graph.adjacency_matrix.float().contiguous(),
                "active_features": graph.active_features.long().contiguous(),
                "selected_features": graph.selected_features.long().contiguous(),
                "activation_values": graph.activation_values.float().contiguous(),
                "input_tokens": graph.input_tokens.long().contiguous(),
                "logit_ids": torch.tensor([t.vocab_idx for t in graph.logit_targets], dtype=torch.long),
                "logit_probabilities": graph.logit_probabilities.float().contiguous(),
            }, str(f))
            ans["file"] = str(f)
            ans["scores"] = [float(s) for s in compute_graph_scores(graph)]
        reply.write(json.dumps(ans) + "\n")
        reply.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
