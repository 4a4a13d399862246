"""``rectrain data convert | verify``: convert text data into columnar files once, and check converted data.

rectrain data convert --config run.toml --out data/criteo_conv      # source, files and table sizes
rectrain data convert --format criteo --num-embeddings 1000000 --out DIR day_0.tsv.gz day_1.tsv.gz
rectrain data verify DIR
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from rectrain.errors import ConfigError

if TYPE_CHECKING:  # the readers import torch: only when a command runs, not to build the parser
    from rectrain.datasets.criteo import CriteoConfig
    from rectrain.datasets.movielens import MovieLensConfig

_MB = 1 << 20


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text}")
    return value


def _table_sizes(text: str) -> int | list[int]:
    sizes = [int(x) for x in text.split(",")]
    return sizes[0] if len(sizes) == 1 else sizes


def _source_config(args: argparse.Namespace) -> CriteoConfig | MovieLensConfig:
    from rectrain.datasets.criteo import CriteoConfig
    from rectrain.datasets.movielens import MovieLensConfig

    if args.config:
        from rectrain.train.config import RunConfig
        from rectrain.train.data import source_config

        overrides = [*(args.set or []), *(["data.strict=true"] if args.strict else [])]
        run = RunConfig.load(args.config, overrides)
        if run.data.source not in ("criteo", "movielens"):
            raise ConfigError(
                f"{args.config}: data.source is {run.data.source!r}; convert reads criteo or movielens"
            )
        paths = args.files or run.data.paths
        config = source_config(run, list(paths))
        assert isinstance(config, (CriteoConfig, MovieLensConfig))
        return config
    if not args.files:
        raise ConfigError("rectrain data convert: give the files to convert (or --config with data.paths)")
    if args.format == "movielens":
        return MovieLensConfig(
            paths=list(args.files),
            num_user_embeddings=args.num_user_embeddings,
            num_movie_embeddings=args.num_movie_embeddings,
            strict=args.strict,
        )
    return CriteoConfig(paths=list(args.files), num_embeddings=args.num_embeddings, strict=args.strict)


def _convert(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rectrain.datasets.convert import convert

    config = _source_config(args)
    with tqdm(
        unit=" rows", unit_scale=True, disable=args.no_progress, file=sys.stderr, desc="convert"
    ) as bar:
        result = convert(
            config, args.out, rows_per_part=args.rows_per_file, overwrite=args.overwrite, on_rows=bar.update
        )
    m = result.manifest
    written = sum(p.bytes for p in m.parts)
    print(
        f"converted {m.num_rows:,} {m.kind} rows ({m.source['rows_skipped']:,} malformed skipped) from "
        f"{len(config.paths)} file(s), {result.input_bytes / _MB:,.1f} MB, into {result.directory}: "
        f"{len(m.parts)} part(s), {written / _MB:,.1f} MB, in {result.seconds:.1f} s "
        f"({result.rows_per_s:,.0f} rows/s)"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from rectrain.datasets.columnar.converted import ConvertedSource
    from rectrain.datasets.columnar.manifest import ColumnarManifest
    from rectrain.datasets.columnar.part_files import DataFormatError

    manifest, directory = ColumnarManifest.load(args.dir)
    manifest.check_files(directory, checksums=not args.no_checksums)
    read, skipped = manifest.source.get("rows_read", 0), manifest.source.get("rows_skipped", 0)
    if not manifest.num_rows or skipped > read:  # the inputs were not the source's text (binary, gzip, ...)
        raise DataFormatError(
            f"{directory}: {manifest.num_rows:,} rows converted, {skipped:,} malformed lines skipped: its "
            f"inputs {manifest.source.get('paths', [])} were not {manifest.kind} text; convert the right ones"
        )
    ConvertedSource([args.dir]).check_parts()
    what = "sizes" if args.no_checksums else "sizes and sha256"
    print(
        f"{directory}: {manifest.num_rows:,} {manifest.kind} rows in {len(manifest.parts)} part(s); "
        f"{what} match"
    )
    return 0


def add_data_command(sub: argparse._SubParsersAction) -> None:
    """Register ``rectrain data convert | verify``."""
    data = sub.add_parser("data", help="convert text data to columnar files; verify converted data")
    commands = data.add_subparsers(dest="data_command", required=True)
    convert = commands.add_parser(
        "convert",
        help="Criteo TSV (.gz) or MovieLens ratings -> columnar files with a manifest",
        description="Parse, hash and validate once (as the training readers do), write part files.",
    )
    convert.add_argument(
        "files", nargs="*", metavar="FILE", help="input files (default: data.paths of --config)"
    )
    convert.add_argument("--out", required=True, metavar="DIR", help="output directory (new or empty)")
    convert.add_argument("--config", metavar="RUN_TOML", help="take source, files and table sizes from a run")
    convert.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a --config key")
    convert.add_argument(
        "--format", choices=("criteo", "movielens"), default="criteo", help="without --config"
    )
    convert.add_argument(
        "--num-embeddings", type=_table_sizes, default=100_000, metavar="N[,N...]", help="Criteo table rows"
    )
    convert.add_argument("--num-user-embeddings", type=_positive, default=200_000, metavar="N")
    convert.add_argument("--num-movie-embeddings", type=_positive, default=300_000, metavar="N")
    convert.add_argument(
        "--rows-per-file", type=_positive, default=1 << 20, metavar="N", help="rows per part"
    )
    convert.add_argument("--strict", action="store_true", help="stop at the first malformed row")
    convert.add_argument("--overwrite", action="store_true", help="replace converted data in --out")
    convert.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    convert.set_defaults(func=_convert)
    verify = commands.add_parser("verify", help="check a converted directory's files against its manifest")
    verify.add_argument("dir", metavar="DIR")
    verify.add_argument("--no-checksums", action="store_true", help="skip sha256 (sizes still checked)")
    verify.set_defaults(func=_verify)
