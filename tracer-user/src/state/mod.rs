//! Process, fd and RM-handle state; live GPU memory ledgers. (to be written)
