# The two commands: `make run` (every notebook at smoke size) and `make test`.
# Each makes .venv (Python 3.11 or 3.12, found by workshop/venv.sh) and installs requirements.lock on first use.
PYTHON ?=
# Only a PYTHON given on make's command line: one exported for other tools (node-gyp's PYTHON=python3) is not ours.
CHOSEN_PYTHON := $(if $(filter command line,$(origin PYTHON)),$(PYTHON),)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
KIT    ?=
INDEX  ?=

.PHONY: venv install lock kit kit-serve doctor run test test-quick lab lab-link submit reset catch-up solutions stack-up stack-down stack-status notebooks export site bench lint compose-check clean-runs

# .venv first, by a supported Python (one another Python made is made again), then the install it lacks. In a
# make of its own, so that the install is judged after a .venv of the wrong Python has gone; KIT and INDEX are
# where `make install` installs from, not `make kit`'s folder.
venv:
	@sh workshop/venv.sh $(VENV) "$(CHOSEN_PYTHON)"
	@$(MAKE) --no-print-directory -s $(STAMP) $(if $(filter install,$(MAKECMDGOALS)),,KIT= INDEX=)

$(STAMP): requirements.lock pyproject.toml
	$(PY) -m workshop.install $(if $(KIT),--kit "$(KIT)") $(if $(INDEX),--index "$(INDEX)")
	@touch $(STAMP)

install: venv  ## make .venv and install requirements.lock, hashes checked: from the registry, KIT=<folder> or INDEX=<url> (a workshop kit)

lock: venv  ## resolve requirements.txt into requirements.lock (every platform, with hashes), as PyPI stands today
	$(PY) -m workshop.lock

KIT_DIR ?= $(or $(KIT),kit)
PLATFORMS ?=
PYTHONS ?= 3.11 3.12
kit: venv  ## a workshop kit for a room without internet (KIT=kit PLATFORMS="linux-x86_64 macos-arm64" PYTHONS="3.11 3.12")
	$(PY) -m workshop.kit --kit "$(KIT_DIR)" $(if $(PLATFORMS),--platforms $(PLATFORMS)) --pythons $(PYTHONS)

KIT_PORT := $(if $(filter command line,$(origin PORT)),$(PORT),8765)
kit-serve: venv  ## serve a workshop kit to the room, read-only (KIT=kit PORT=8765); prints what learners type
	$(PY) -m workshop.kit_serve --kit "$(KIT_DIR)" --port $(KIT_PORT)

doctor: venv  ## is this laptop ready? Python, disk, memory, socket paths, ports, the stack, a Ray task: one line each
	$(PY) -m workshop.doctor

run: venv  ## start the embedded stack (fetching lakeFS where it is missing and there is internet) and execute every notebook into runs/
	$(PY) -m workshop.stack up --download-lakefs
	$(PY) -m workshop.runner

TEST_PROCESSES ?= 2
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=600 --nbval-sanitize-with tests/suite/nbval_sanitize.cfg
test: venv  ## unit + notebook tests against real local services (each test process starts its own private stack), and nbval over the committed notebooks
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --timings-json runs/test-timings.json $(NBVAL) tests notebooks

QUICK ?= not notebook and not slow
test-quick: venv  ## the inner loop (2 min): no notebook run end to end, no slow test; QUICK="not notebook" adds the slow ones (11 min)
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --timings-json runs/test-timings.json -m "$(QUICK)" tests

LAB_ARGS ?=
lab: venv  ## JupyterLab on the notebooks, the stack, its Ray with the dashboard; prints every URL (LAB_ARGS="--jupyter-port 8890")
	$(PY) -m workshop.stack up --download-lakefs --no-ray
	$(PY) -m workshop.lab $(LAB_ARGS)

lab-link: venv  ## a new one-time sign-in link for the running lab's Ray dashboard (each link works once)
	@$(PY) -m workshop.lab --sign-in-link

NB ?=
ARGS ?=
ADDRESS ?=
submit: venv  ## a notebook as a Ray Job on the lab's Ray or a cluster: make submit NB=04 ARGS="-p epochs 3" [ADDRESS=http://<head>:8265]
	@test -n "$(NB)" || { echo "error: name a notebook: make submit NB=04 ARGS=\"-p epochs 3\""; exit 2; }
	$(PY) -m workshop.submit $(NB) $(ARGS) $(if $(ADDRESS),--address $(ADDRESS))

reset: venv  ## stop the embedded stack and delete its data (buckets, MLflow runs, lakeFS repositories) and runs/
	$(PY) -m workshop.stack down
	rm -rf .stack runs

catch-up: venv  ## run the notebooks before NN headlessly (make catch-up NN=04), to join a workshop there
	@test -n "$(NN)" || { echo "make catch-up NN=04: NN is the number of the notebook you join at"; exit 2; }
	$(PY) -m workshop.stack up --download-lakefs
	$(PY) -m workshop.runner --before $(NN)

stack-up: venv
	$(PY) -m workshop.stack up

stack-down: venv
	$(PY) -m workshop.stack down

stack-status: venv
	$(PY) -m workshop.stack status

notebooks: venv  ## refresh the committed notebooks' outputs: one run of all, from a clean tree, on a fresh private stack
	$(PY) benchmarks/refresh_notebooks.py

solutions: venv  ## for an instructor: every notebook with every exercise's solution run, into runs/solutions-<time>/
	$(PY) -m workshop.stack up --download-lakefs
	$(PY) -m workshop.runner --solutions

export: venv  ## regenerate helpers' lesson modules from the notebooks' #@save cells
	$(PY) -m workshop.export

site: venv  ## the lessons as a website in runs/site/html, from the committed outputs (warnings are errors, links and offline checked); preview: python -m http.server --bind 127.0.0.1 -d runs/site/html
	$(PY) -m workshop.site

bench: venv stack-up  ## benchmarks: JSON in benchmarks/results/, a table on stdout
	$(PY) benchmarks/bench_upload_listing.py
	$(PY) benchmarks/bench_data_loading.py
	$(PY) benchmarks/bench_training.py
	$(PY) benchmarks/bench_tune.py
	$(PY) benchmarks/bench_tune.py --smoke-test-size 12000
	$(PY) benchmarks/bench_smoke.py --lakefs-double
	$(PY) benchmarks/bench_smoke.py --lakefs-double --ray lab --label "make lab's Ray"
	$(PY) benchmarks/bench_inference.py
	$(PY) benchmarks/bench_serve.py
	$(PY) benchmarks/bench_full_size.py
	$(PY) benchmarks/bench_scale.py --cleanup
	$(PY) benchmarks/bench_site.py

lint: venv
	$(VENV)/bin/ruff check helpers workshop tests benchmarks

compose-check:  ## needs a Docker engine
	docker compose config --quiet

clean-runs:
	rm -rf runs/
