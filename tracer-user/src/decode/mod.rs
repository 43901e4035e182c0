//! Pure decoding of ring-buffer records into typed events. (to be written)
