"""Storage: one contract, its backends, and the table models.

`base` is the contract; `sqlite` the default backend (one file per thread); `memory` the
in-memory reference backend (for tests); `models` the one schema definition, with the DDL
generated from it in `schema`.
"""
