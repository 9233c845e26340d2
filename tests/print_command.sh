# LAUNCH for tests/test_recipes.py: instead of running the command line a recipe launches, print the folder it would
# run in, then the command, each argument shell-quoted (a path with a space stays one word for shlex.split).
printf '%q ' "$PWD" "$@"
echo
