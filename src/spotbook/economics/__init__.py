"""What runs cost: the price table, a run's bill (``cost``), a model of long runs under
preemption (``simulate``), and real runs preempted on purpose (``chaos``)."""
