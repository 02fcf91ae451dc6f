"""Decisions read from forecasts: comparing two recipes by the paper's rule (``compare``), stopping
a variant early (``stop``) and calling an arm worse from its data alone where no curve describes it
(``bounded``). Imports the forecasts and models below it, never the sizes study or the command line."""
