"""Lightning's own LightningCLI example, unchanged: a tiny demo model and random data from
Lightning's demos.  Nothing here knows about dispatch; job.sh does (LightningCLI needs
``pip install "jsonargparse[signatures]"``, Lightning's ``pytorch-extra``)."""

from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringDataModule, DemoModel


def cli_main() -> None:
    LightningCLI(DemoModel, BoringDataModule)


if __name__ == "__main__":
    cli_main()
