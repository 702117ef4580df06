"""One module per operator of the suite (as suites/ops/<op>.cpp). Each defines NAME, SHAPES (the
suite's shapes) and cases(dtypes, directions, shapes=None) yielding common.PeerCase, where
directions holds False (forward) and/or True (forward + backward) and shapes None means SHAPES."""
