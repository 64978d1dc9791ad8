"""The order of the pipelines whose last stage reads it: the track stages log the manifests of every
stage their pipeline runs before them (stages/track.py). Here, not in stages/declarations.py, because
the declarations name the track stage: reading the order from there made a circle of imports."""

MAIN_ORDER = ("outcomes", "materialise", "collect", "reprice", "validate", "evaluate", "grid", "routers", "register",
              "replay", "track")
MTROUTER_ORDER = ("mtrouter-collect", "mtrouter-ablations", "mtrouter-evaluate", "mtrouter-analyses",
                  "mtrouter-register", "mtrouter-track")
