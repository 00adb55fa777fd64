"""The induction circuit: a model's induction head and the previous-token head(s) that feed it, found by
head scores and confirmed by ablating each part alone.

:func:`find_induction_circuit` ranks heads by their scores (:func:`sprout_interp.circuits.attention.head_scores`)
and confirms them causally: it ablates each candidate alone (mean ablation by default) and measures, with
:func:`sprout_interp.circuits.evidence.ablation_effects`' measurer, what that removes of the copying
(invented-name copying at a name's second occurrence), of the induction head's induction score (the path
from a previous-token head to the induction head) and of the ordinary held-out loss. A head counts only when
its own ablation removes copying *specifically* (:func:`sprout_interp.circuits.evidence.specificity`), so a
head whose removal breaks the whole model is not called a copying head. The previous-token part and the
induction part are judged each from its own ablation (:meth:`InductionCircuit.verdicts`). The chapter's
gpt-4 has a previous-token head in layer 2 and an induction head in layer 3.

Layers are 0-indexed as in code (``blocks.{layer}``); ``*_block`` = layer + 1, the chapter's "layer N".
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

import pandas as pd

from sprout_interp.circuits.attention import SCORE_COLUMNS, head_scores
from sprout_interp.circuits.evidence import NO_COPYING, EffectMeasurer, effect_row, effects_frame, is_specific
from sprout_interp.circuits.heads import Head, Kind, head_label, heads_label
from sprout_interp.core.errors import AblationError
from sprout_interp.core.hooked import as_hooked

__all__ = ["find_induction_circuit", "InductionCircuit", "REPRODUCED_SHARE", "PARTLY_SHARE"]



REPRODUCED_SHARE, PARTLY_SHARE = 0.5, 1 / 3  # share of the copying gain a part's own ablation must remove


@dataclass
class InductionCircuit:
    """The induction circuit of a model: its induction head and the previous-token head(s) that feed it.

    Layers are 0-indexed as in code; ``*_block`` = layer + 1, the chapter's count.

    Scores: ``prev_score`` is the previous-token head's ranking score (with ``scores_on="both"`` the
    weaker of its scores on repeated random tokens and on natural text: a previous-token head attends
    to the token before on any text); ``induction_score`` the induction head's score on repeated
    random tokens (on ``"text"``: natural text). ``prev_earlier``/``prev_before_*`` compare the
    best-scoring previous-token head with the induction head's block.

    Causal confirmation (``confirmed``, when a model was given): each candidate head is ablated alone
    (``kind``), and the previous-token heads together, and ``evidence`` holds one row per condition
    (:func:`ablation_effects`' columns plus the head scores and ``chosen``). The induction head is
    the best-scoring candidate whose own ablation removes copying specifically; ``prev_tokens`` are
    the heads in earlier blocks that score as previous-token heads and whose own ablation lowers the
    copying or the induction head's induction score, specifically (not by breaking the model); when no
    single one does but several together do, the work is shared and all of them are returned.
    ``prev_layer``/``prev_head`` is the first of ``prev_tokens`` (best own effect), or with no
    confirmation the best-scoring previous-token head.
    ``found``: confirmed, both parts hold (an induction head whose removal removes copying and at
    least one previous-token head that feeds it); without confirmation, both scores reach
    ``threshold`` with a previous-token head in an earlier block. :meth:`verdicts` judges each part.
    """

    model: str
    prev_layer: int
    prev_head: int
    prev_score: float
    induction_layer: int
    induction_head: int
    induction_score: float
    prev_earlier: bool
    prev_before_layer: Optional[int]
    prev_before_head: Optional[int]
    prev_before_score: Optional[float]
    threshold: float
    found: bool
    scores_on: str
    clean_copying_ratio: Optional[float] = None
    prev_tokens: list[Head] = field(default_factory=list)
    confirmed: bool = False
    kind: Optional[str] = None
    copying: Optional[str] = None  # "names" or "repeated": what the evidence's copying columns measure
    min_share: float = 0.1
    min_specificity: float = 3.0
    evidence: Optional[pd.DataFrame] = field(default=None, repr=False, compare=False)

    @property
    def prev_block(self) -> int:
        return self.prev_layer + 1

    @property
    def induction_block(self) -> int:
        return self.induction_layer + 1

    @property
    def prev_label(self) -> str:
        """The previous-token head(s), :func:`head_label` joined by ' + ' (the best-scoring one without confirmation)."""
        return heads_label(self.prev_tokens or [(self.prev_layer, self.prev_head)])

    @property
    def induction_label(self) -> str:
        return head_label(self.induction_layer, self.induction_head)

    def heads(self) -> list[Head]:
        """The circuit's heads ``[(layer, head), ...]``, 0-indexed, for ``ablate``: previous-token head(s), then the
        induction head. Confirmed: the previous-token heads the ablations confirmed (none when none was);
        from scores only: the best-scoring previous-token head."""
        prev = self.prev_tokens if self.confirmed else [(self.prev_layer, self.prev_head)]
        return [*prev, (self.induction_layer, self.induction_head)]

    def row(self, condition: str) -> Optional[pd.Series]:
        """The ``evidence`` row of a condition (see :meth:`conditions`), or None."""
        if self.evidence is None:
            return None
        hit = self.evidence[self.evidence["condition"] == condition]
        return None if hit.empty else hit.iloc[0]

    def prev_effect(self) -> Optional[pd.Series]:
        """The evidence row of the previous-token head(s) ablated together without the induction head."""
        if not self.prev_tokens:
            return None
        return self.row(PREV_SET if len(self.prev_tokens) > 1 else head_label(*self.prev_tokens[0]))

    def induction_effect(self) -> Optional[pd.Series]:
        """The evidence row of the induction head ablated alone."""
        return self.row(self.induction_label)

    def copying_gain(self) -> float:
        """The clean copying gain (mean probability, second occurrence minus first); NaN without evidence."""
        if self.evidence is None:
            return float("nan")
        return float(self.evidence.attrs["clean_copying_second"] - self.evidence.attrs["clean_copying_first"])

    def as_dict(self) -> dict:
        """The circuit as plain values (heads, scores, evidence), for JSON or a table."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "evidence"}
        d.update(prev_block=self.prev_block, induction_block=self.induction_block, prev_label=self.prev_label,
                 induction_label=self.induction_label)
        for part, (word, _) in self.verdicts().items():
            d[f"{part}_verdict"] = word
        pe, ie = self.prev_effect(), self.induction_effect()
        for name, r in (("prev", pe), ("induction", ie)):
            for col in ("copying_removed", "loss_change", "specificity", "induction_drop"):
                d[f"{name}_{col}"] = float(r[col]) if r is not None else None
        return d

    def verdicts(self, reproduced: float = REPRODUCED_SHARE, partly: float = PARTLY_SHARE) -> dict[str, tuple[str, str]]:
        """``{"previous-token": (verdict, evidence), "induction": (verdict, evidence)}``, each part judged by its own ablation.

        A part is "REPRODUCED" when its own ablation (the previous-token head(s) together without the
        induction head; the induction head alone) removes at least ``reproduced`` of the copying gain,
        specifically (each head's specificity at least ``min_specificity``) and, for the previous-token
        part, lowers the induction head's induction score by at least ``min_share``; "PARTLY" at
        ``partly`` or more; otherwise "NOT established". Without ablation evidence nothing is established.
        """
        if not self.confirmed or self.evidence is None:
            why = "scores only: no head was ablated"
            return {"previous-token": ("NOT established", why), "induction": ("NOT established", why)}
        measure = "name-copying" if self.copying == "names" else "copying"
        gain = self.copying_gain()
        if not gain >= NO_COPYING:
            why = (f"the model does not copy: clean {measure} {_pct(self.evidence.attrs['clean_copying_second'])} "
                   f"at the second occurrence, {_pct(self.evidence.attrs['clean_copying_first'])} at the first")
            return {"previous-token": ("NOT established", why), "induction": ("NOT established", why)}

        def judge(share: float, specific: bool, path: bool) -> str:
            if share >= reproduced and specific and path:
                return "REPRODUCED"
            return "PARTLY" if share >= partly and specific else "NOT established"

        ie = self.induction_effect()
        ind_specific = is_specific(float(ie["specificity"]), self.min_specificity)
        ind = (judge(float(ie["copying_removed"]), ind_specific, self.induction_score >= self.threshold),
               f"{self.induction_label} (induction score {self.induction_score:.2f}) ablated alone: {_effect_text(ie, measure)}"
               + ("" if ind_specific else "; NOT specific: its removal breaks the model, not copying alone"))
        pe = self.prev_effect()
        if pe is None:
            cands = self.evidence[self.evidence["role"] == "previous-token candidate"]
            best = "" if cands.empty else (
                f"; best candidate {cands.iloc[0]['heads']} alone: {_effect_text(cands.iloc[0], measure)}")
            return {"previous-token": ("NOT established", f"no head before {self.induction_label} lowers the copying or "
                                       f"its induction score, specifically, when ablated{best}"),
                    "induction": ind}
        singles = [self.row(head_label(*h)) for h in self.prev_tokens]
        all_specific = is_specific(float(pe["specificity"]), self.min_specificity) and all(
            is_specific(float(r["specificity"]), self.min_specificity) or float(r["copying_removed"]) < self.min_share
            for r in singles)  # a head that matters only with the others is judged by the set
        path = float(pe["induction_drop"]) >= self.min_share
        each = ""
        if len(singles) > 1:
            each = " (each alone: " + ", ".join(f"{r['heads']} {_pct(float(r['copying_removed']))}" for r in singles) + ")"
        prev = (judge(float(pe["copying_removed"]), all_specific, path),
                f"{self.prev_label} ablated {'together ' if len(singles) > 1 else ''}without the induction head: "
                f"{_effect_text(pe, measure)}{each}")
        return {"previous-token": prev, "induction": ind}

    def verdict(self) -> str:
        """The circuit as a whole: "REPRODUCED" only when both parts are (:meth:`verdicts`), "PARTLY" when
        both are at least partly established, else "NOT reproduced"."""
        words = [w for w, _ in self.verdicts().values()]
        if all(w == "REPRODUCED" for w in words):
            return "REPRODUCED"
        return "PARTLY" if "NOT established" not in words else "NOT reproduced"

    def summary(self) -> str:
        """One line a person reads: blocks counted from 1 as in the chapter, code layers in brackets."""
        name = self.model or "model"
        if not self.confirmed:
            s = (f"{name}: best previous-token head {head_label(self.prev_layer, self.prev_head)} (score "
                 f"{self.prev_score:.2f}); best induction head {self.induction_label} (score {self.induction_score:.2f}); ")
            s += "previous-token head in an earlier block" if self.prev_earlier else "previous-token head NOT in an earlier block"
            if not self.prev_earlier and self.prev_before_layer is not None:
                s += (f" (best earlier one: {head_label(self.prev_before_layer, self.prev_before_head)}, "
                      f"score {self.prev_before_score:.2f})")
            s += "; circuit found" if self.found else f"; no circuit at threshold {self.threshold:.2f}"
            return s + " (head scores only, not confirmed by ablation)"
        v = self.verdicts()
        prev = self.prev_label if self.prev_tokens else "none confirmed"
        return (f"{name}: induction head {self.induction_label} (score {self.induction_score:.2f}): {v['induction'][0]}; "
                f"previous-token head(s) {prev}: {v['previous-token'][0]} ({self.kind} ablation, each part alone)")


PREV_SET = "previous-token heads together"
PREV_CANDIDATES_SET = "previous-token candidates together"
PREV_SCORED_SET = "previous-token heads by score together"
CIRCUIT_SET = "the circuit together"


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}%"


def _effect_text(r: pd.Series, measure: str) -> str:
    """One row of the evidence as a phrase: 'removes {copying_removed}% of the {measure} gain (2nd occurrence
    {copying_second}%), held-out loss {loss_change:+} nats (specificity {specificity})', then the induction head's
    induction score and its change when the row measured one."""
    s = (f"removes {_pct(float(r['copying_removed']))} of the {measure} gain (2nd occurrence "
         f"{_pct(float(r['copying_second']))}), held-out loss {float(r['loss_change']):+.3f} nats "
         f"(specificity {float(r['specificity']):.1f})")
    if float(r["induction_drop"]) == float(r["induction_drop"]):
        s += f", induction head's induction score {float(r['induction_score']):.2f} ({-100 * float(r['induction_drop']):+.0f}%)"
    return s


def _ranks(scores: pd.DataFrame, on: str) -> tuple[pd.Series, pd.Series]:
    """(previous-token ranking score, induction ranking score) per row of a head_scores table."""
    if on == "both":
        prev = scores[["prev_token_random", "prev_token_text"]].min(axis=1)
    else:
        prev = scores[f"prev_token_{on}"]
    ind = scores["induction_text" if on == "text" else "induction_random"]
    return prev, ind


def _ranked(scores: pd.DataFrame, on: str, threshold: float, name: str, min_share: float,
            min_specificity: float) -> tuple[InductionCircuit, pd.Series, pd.Series]:
    """The circuit as the head scores alone rank it (nothing ablated), and the previous-token and induction
    ranking scores of every row of ``scores``."""
    prank, irank = _ranks(scores, on)
    i = int(irank.idxmax())
    il = int(scores.loc[i, "layer"])
    p = int(prank.idxmax())
    earlier = prank[scores["layer"] < il]
    pb = None if earlier.empty else int(earlier.idxmax())
    ratio = scores.attrs.get("clean_copying_ratio")
    circ = InductionCircuit(
        model=name,
        prev_layer=int(scores.loc[p, "layer"]), prev_head=int(scores.loc[p, "head"]), prev_score=float(prank[p]),
        induction_layer=il, induction_head=int(scores.loc[i, "head"]), induction_score=float(irank[i]),
        prev_earlier=int(scores.loc[p, "layer"]) < il,
        prev_before_layer=None if pb is None else int(scores.loc[pb, "layer"]),
        prev_before_head=None if pb is None else int(scores.loc[pb, "head"]),
        prev_before_score=None if pb is None else float(prank[pb]),
        threshold=threshold,
        found=bool(irank[i] >= threshold and pb is not None and prank[pb] >= threshold),
        scores_on=on,
        clean_copying_ratio=None if ratio is None else float(ratio),
        min_share=min_share, min_specificity=min_specificity,
    )
    return circ, prank, irank


def find_induction_circuit(
    model=None,
    scores: Optional[pd.DataFrame] = None,
    on: str = "both",
    threshold: float = 0.3,
    confirm: Optional[bool] = None,
    kind: Kind = "mean",
    reference=None,
    copying: Optional[str] = None,
    held_out=None,
    min_share: float = 0.1,
    min_specificity: float = 3.0,
    max_candidates: int = 6,
    **head_scores_kwargs,
) -> InductionCircuit:
    """The induction head and the previous-token head(s) that feed it, ranked by head scores and confirmed by ablation.

    Ranking: induction heads by their induction score on repeated random tokens; previous-token
    heads, with ``on="both"`` (default), by the weaker of their previous-token scores on repeated
    random tokens and on natural text (a head that looks back one token only on random tokens is not
    a previous-token head). ``on="random"``/``"text"`` rank by one of them.

    Confirmation (``confirm``, default: when a model is given; nothing is confirmed when the model does
    not copy, a clean gain below ``NO_COPYING``): heads scoring at least ``threshold``
    as induction heads (at most ``max_candidates``, at least the best) are ablated alone; the induction
    head is the one whose ablation removes the largest share of the copying gain while being specific
    (``min_specificity``, see :func:`specificity`) and removing at least ``min_share``. Then each head
    in an earlier block that scores at least ``threshold`` as a previous-token head on either text (at
    most ``max_candidates``) is ablated alone, measuring the copying and the induction head's
    induction score: the previous-token heads are those that score at least ``threshold`` (ranking
    score), are specific and lower either by at least ``min_share``; several when several do, or all
    of them when only together they do. The previous-token heads together, all candidates together
    and the whole circuit are ablated too. ``kind``/``reference``/``copying``/``held_out``: as in
    :func:`ablation_effects`.

    ``scores``: a :func:`head_scores` table (computed with ``copying=False`` when None; its
    ``seq_len``/``batch``/``seed`` give the repeated tokens of the induction-score check).
    ``head_scores_kwargs`` go to :func:`head_scores`.

    Returns:
        :class:`InductionCircuit`; ``.evidence`` holds every ablation's numbers, ``.verdicts()`` judges
        the previous-token and the induction part each from its own ablation.
    """
    if on not in ("both", "random", "text"):
        raise AblationError(f"on must be 'both', 'random' or 'text', got {on!r}")
    confirm = model is not None if confirm is None else confirm
    if confirm and model is None:
        raise AblationError("confirming the circuit by ablation needs the model: pass it, or confirm=False")
    if scores is None:
        if model is None:
            raise AblationError("pass a model or a head_scores table")
        head_scores_kwargs.setdefault("copying", False)
        if on == "random":
            head_scores_kwargs.setdefault("natural", False)
        scores = head_scores(model, **head_scores_kwargs)
    if on == "both" and not {"prev_token_text", "induction_text"} <= set(scores.columns):
        on = "random"  # no natural-text scores in the table: rank on the random tokens alone
    need = {"prev_token_random", "induction_random"} if on != "text" else {"prev_token_text", "induction_text"}
    if not need <= set(scores.columns):
        raise AblationError(f"the scores table has no {sorted(need - set(scores.columns))} columns (was it made with natural=False?)")
    scores = scores.reset_index(drop=True)
    name = scores.attrs.get("model", "") or (getattr(model, "name", "") if model is not None else "")
    circ, prank, irank = _ranked(scores, on, threshold, name, min_share, min_specificity)
    if not confirm:
        return circ
    return _confirm(circ, as_hooked(model), scores, prank, irank, kind, reference, copying, held_out, max_candidates)


def _confirm(circ: InductionCircuit, model, scores: pd.DataFrame, prank: pd.Series, irank: pd.Series, kind: Kind,
             reference, copying: Optional[str], held_out, max_candidates: int) -> InductionCircuit:
    """``circ`` confirmed by ablation, in place: the induction head, then the previous-token heads, then the sets.

    One function on purpose: each stage reads the measurements and choices of the one before it (the induction
    head chosen in stage 1 is the head whose score stage 2 watches), and the evidence table is all of their rows
    in the order they were measured; read top to bottom it is the algorithm :func:`find_induction_circuit`
    describes.
    """
    from sprout_model.evaluation import repeated_tokens_batch

    threshold, min_share, min_specificity, on, name = circ.threshold, circ.min_share, circ.min_specificity, circ.scores_on, circ.model
    i = int(irank.idxmax())
    seq_len = int(scores.attrs.get("seq_len", 64))
    rep = repeated_tokens_batch(model.cfg.d_vocab, min(seq_len, model.cfg.n_ctx // 2), int(scores.attrs.get("batch", 16)),
                                int(scores.attrs.get("seed", 0))).to(model.device)
    meas = EffectMeasurer(model, kind, reference, copying, held_out, rep, seed=int(scores.attrs.get("seed", 0)))
    d_vocab = model.cfg.d_vocab
    key = list(zip(scores["layer"].astype(int), scores["head"].astype(int)))
    score_cols = [c for c in SCORE_COLUMNS if c in scores]

    def with_scores(row: dict, idx: Optional[int]) -> dict:
        for c in score_cols:
            row[c] = float(scores.loc[idx, c]) if idx is not None else float("nan")
        row["rank_score"] = float("nan") if idx is None else float(prank[idx] if row["role"].startswith("previous") else irank[idx])
        return row

    # 1. the induction head: the candidates by score, each ablated alone
    clean0 = meas.run([])
    order = irank.sort_values(ascending=False, kind="stable")
    cand_i = [int(ix) for ix in order.index[: max_candidates] if irank[ix] >= threshold] or [i]
    ind_rows = []
    for ix in cand_i:
        r = effect_row(head_label(*key[ix]), "induction candidate", [key[ix]], meas.run([key[ix]]), clean0, d_vocab)
        ind_rows.append(with_scores(r, ix))
    copies = clean0["copying_second"] - clean0["copying_first"] >= NO_COPYING  # else there is no copying to remove
    ok = [r for r, ix in zip(ind_rows, cand_i) if copies and irank[ix] >= threshold
          and is_specific(r["specificity"], min_specificity) and r["copying_removed"] >= min_share]
    if ok:
        best = max(ok, key=lambda r: r["copying_removed"])
        bi = cand_i[ind_rows.index(best)]
        circ.induction_layer, circ.induction_head, circ.induction_score = key[bi][0], key[bi][1], float(irank[bi])
    ind_head = (circ.induction_layer, circ.induction_head)
    il = circ.induction_layer

    # 2. previous-token heads: earlier blocks, scoring on either text; each alone, with the induction head's score
    clean = dict(clean0, induction_score=meas.induction([], ind_head))
    earlier = prank[scores["layer"] < il]
    pb = None if earlier.empty else int(earlier.idxmax())
    circ.prev_before_layer = None if pb is None else int(scores.loc[pb, "layer"])
    circ.prev_before_head = None if pb is None else int(scores.loc[pb, "head"])
    circ.prev_before_score = None if pb is None else float(prank[pb])
    circ.prev_earlier = circ.prev_layer < il
    prev_any = scores[[c for c in ("prev_token_random", "prev_token_text") if c in scores]].max(axis=1)
    order = prank[scores["layer"] < il].sort_values(ascending=False, kind="stable")
    cand_p = [int(ix) for ix in order.index if prev_any[ix] >= threshold][: max_candidates]
    prev_rows = []
    for ix in cand_p:
        r = effect_row(head_label(*key[ix]), "previous-token candidate", [key[ix]], meas.run([key[ix]], ind_head), clean, d_vocab)
        prev_rows.append(with_scores(r, ix))

    def feeds(r: dict) -> bool:
        return copies and (r["copying_removed"] >= min_share or r["induction_drop"] >= min_share)

    scored = [(r, ix) for r, ix in zip(prev_rows, cand_p) if prank[ix] >= threshold]
    chosen = sorted([(r, ix) for r, ix in scored if feeds(r) and is_specific(r["specificity"], min_specificity)],
                    key=lambda t: -t[0]["copying_removed"])
    set_rows = []
    if len(cand_p) > 1 and set(cand_p) != {ix for _, ix in chosen}:
        heads = [key[ix] for ix in cand_p]
        set_rows.append(with_scores(effect_row(PREV_CANDIDATES_SET, "set", heads, meas.run(heads, ind_head), clean, d_vocab), None))
    if not chosen and len(scored) > 1:  # no head alone: is the work shared between them?
        heads = [key[ix] for _, ix in scored]
        if len(scored) == len(cand_p):
            together = set_rows[0]
        else:
            together = with_scores(effect_row(PREV_SCORED_SET, "set", heads, meas.run(heads, ind_head), clean, d_vocab), None)
            set_rows.append(together)
        if feeds(together) and is_specific(together["specificity"], min_specificity):
            chosen = sorted(scored, key=lambda t: -t[0]["copying_removed"])
    circ.prev_tokens = [key[ix] for _, ix in chosen]
    if len(chosen) > 1:
        same = [r for r in set_rows if set(r["head_pairs"]) == set(circ.prev_tokens)]
        if same:
            same[0]["condition"] = PREV_SET
        else:
            set_rows.insert(0, with_scores(effect_row(PREV_SET, "set", circ.prev_tokens, meas.run(circ.prev_tokens, ind_head),
                                                       clean, d_vocab), None))
    if circ.prev_tokens:
        heads = [*circ.prev_tokens, ind_head]
        set_rows.append(with_scores(effect_row(CIRCUIT_SET, "set", heads, meas.run(heads, ind_head), clean, d_vocab), None))
        circ.prev_layer, circ.prev_head = circ.prev_tokens[0]
        circ.prev_score = float(prank[chosen[0][1]])
        circ.prev_earlier = True
    clean_row = effect_row("clean", "clean", [], clean, clean, d_vocab)
    rows = [with_scores(clean_row, None), *ind_rows, *prev_rows, *set_rows]
    chosen_heads = {*circ.prev_tokens, *([ind_head] if ok else [])}
    for r in rows:
        r["chosen"] = r["n_heads"] == 1 and (int(r["layer"]), int(r["head"])) in chosen_heads
    circ.evidence = effects_frame(rows, clean, meas, ind_head)
    circ.evidence.attrs.update(model=name, scores_on=on, threshold=threshold, min_share=min_share, min_specificity=min_specificity)
    ie = circ.induction_effect()
    circ.found = bool(ok) and bool(circ.prev_tokens) and ie is not None
    circ.confirmed, circ.kind, circ.copying = True, kind, meas.copying
    return circ


