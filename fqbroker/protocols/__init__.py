"""The wire formats servers and clients share: sans-I/O encoders and decoders, one package a
protocol."""
