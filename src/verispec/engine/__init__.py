"""The engine: one loop (:mod:`.loop`) over a batch of requests, a single prompt being a
batch of one; what it calls (:mod:`.protocols`), its requests and rows (:mod:`.request`),
draft-length policies (:mod:`.gamma`), statistics (:mod:`.stats`) and the exact laws of
its methods on toy models (:mod:`.exact`)."""
