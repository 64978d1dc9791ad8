"""Router families made for pools of many workers (issue 28): cost-aware label classification,
calibrated per-worker success probabilities with expected-utility selection, and a K-step cascade
with per-step thresholds fitted on a validation fold; and the routing literature's K-worker routers:
RouterDC's dual contrastive encoder, EmbedLLM's model embeddings, GraphRouter's task–query–LLM graph;
and a stacked ensemble of the strongest estimators, its weights fitted on the training queries alone;
and outcome estimators on lexical features of the whole query (TF-IDF word and character n-grams);
and kNN on the controller LM's (SmolLM2-135M) mean-pooled hidden states of the whole query.
Each is a `models.base.Router`: fit on a table, an (n, w) quality matrix, and a `decide` that reads
only that matrix, so the replay harness, registration and serving take them like any baseline
(models/registry.py names them).
"""

from __future__ import annotations

from models.kworkers.calibrated import CalibratedRouter
from models.kworkers.cascade import KStepCascade
from models.kworkers.embedllm import EmbedLLMRouter
from models.kworkers.graphrouter import GraphRouter
from models.kworkers.labels import CostLabelRouter, cheapest_correct_labels
from models.kworkers.lexical import LexicalFeaturizer, LexicalKNNRouter, LexicalLogisticRouter
from models.kworkers.lm_vectors import LMKNNRouter, LMQueryEncoder
from models.kworkers.routerdc import RouterDCRouter
from models.kworkers.stacked import StackedRouter
from models.kworkers.validation import validation_split

__all__ = ["CalibratedRouter", "CostLabelRouter", "EmbedLLMRouter", "GraphRouter", "KStepCascade", "LexicalFeaturizer",
           "LexicalKNNRouter", "LexicalLogisticRouter", "LMKNNRouter", "LMQueryEncoder", "RouterDCRouter",
           "StackedRouter", "cheapest_correct_labels", "validation_split"]
