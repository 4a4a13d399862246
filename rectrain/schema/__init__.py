"""``torchrec.schema``: checks that a public signature still accepts the calls an older one accepted."""
