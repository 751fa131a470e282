"""CSV tables: the byte-stream scanner, the pyarrow stream of raw cells, typed rows, records made
a batch at a time, and the receipts and fingerprints that prove a file was read whole."""
