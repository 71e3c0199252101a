Feature: Git worktree sandbox lifecycle
  As a developer
  I want a sandbox that isolates plan changes in a git worktree on its own branch
  So that changes are reviewed as a branch and merged back into the original on commit

  # --- Creation ---

  Scenario: Create a git worktree sandbox
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    Then the git sandbox should be in the "created" state
    And the git sandbox context should reference plan "plan-001"
    And the git sandbox context should have strategy metadata "git_worktree"
    And the git sandbox worktree should exist
    And the git sandbox branch should start with "sandbox/plan-001/"

  Scenario: The sandbox works on a new branch and never checks out the original branch
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    Then the git sandbox worktree should be on the sandbox branch
    And the git original should still be on branch "main"
    And the git repository should list 2 worktrees

  Scenario: Creating a git sandbox with empty plan_id raises ValueError
    Given a git test repository is initialised
    When a git sandbox is created with empty plan_id
    Then a git ValueError should be raised with message "plan_id cannot be empty"

  Scenario: Creating a git sandbox with empty resource_id raises ValueError
    Given a git test repository is initialised
    When a git sandbox is prepared with empty resource_id
    Then a git ValueError should be raised with message "resource_id cannot be empty"

  Scenario: Creating a git sandbox with empty original_path raises ValueError
    Given a git test repository is initialised
    When a git sandbox is prepared with empty original_path
    Then a git ValueError should be raised with message "original_path cannot be empty"

  Scenario: Creating a git sandbox on a non-existent directory raises SandboxCreationError
    Given a git test repository is initialised
    When a git sandbox is created on a non-existent directory for plan "plan-001"
    Then a git SandboxCreationError should be raised
    And the git sandbox should be in the "errored" state

  Scenario: Creating a git sandbox on a directory that is not a repository raises SandboxCreationError
    Given a git test repository is initialised
    When a git sandbox is created on a plain directory for plan "plan-001"
    Then a git SandboxCreationError should be raised with message "not a git repository"

  Scenario: A duplicate sandbox id is refused and leaves the first sandbox alone
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And a second git sandbox with the same id is created for plan "plan-001"
    Then a git SandboxCreationError should be raised with message "already exists"
    And the git repository should list 2 worktrees

  Scenario: A failing create leaves no worktree, directory or branch behind
    Given a git test repository is initialised
    And git worktree add is made to fail after it ran
    When a git sandbox create is attempted for plan "plan-createerr"
    Then a git SandboxCreationError should be raised
    And the git sandbox should be in the "errored" state
    And the git repository should list 1 worktrees
    And the git repository should have only the branch "main"

  # --- Path resolution ---

  Scenario: Resolve a path in the git worktree
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git path "data/file.txt" is resolved
    Then the git resolved path should be inside the worktree
    And the git sandbox should be in the "active" state

  Scenario: Path traversal is rejected
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git path "../etc/passwd" is resolved
    Then a git ValueError should be raised with message "Path traversal not allowed"

  Scenario: Paths into the worktree's .git are rejected
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git path ".git/config" is resolved
    Then a git ValueError should be raised with message "Path traversal not allowed"

  Scenario: Resolving a path on a cleaned-up sandbox raises SandboxStateError
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git sandbox is cleaned up
    And the git path "file.txt" is resolved on a cleaned-up sandbox
    Then a git SandboxStateError should be raised

  # --- Commit ---

  Scenario: Commit with no changes produces empty result
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git sandbox is committed
    Then the git commit result should indicate success
    And the git commit result should have 0 changed files
    And the git commit result should have 0 added files
    And the git commit result should have 0 deleted files

  Scenario: Commit with a new file merges it into the original branch
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And a git file "new_file.txt" is created in the sandbox with content "hello world"
    And the git sandbox is committed
    Then the git commit result should indicate success
    And the git commit result should have 1 added files
    And the git file "new_file.txt" should exist in the original with content "hello world"
    And the git original branch should point at the commit result
    And the git original working tree should be clean

  Scenario: Commit with a modified file merges the change
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git existing file "existing.txt" is modified in the sandbox with content "updated"
    And the git sandbox is committed
    Then the git commit result should indicate success
    And the git commit result should have 1 changed files
    And the git file "existing.txt" in the original should have content "updated"

  Scenario: Commit with a deleted file removes it from the original
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git existing file "existing.txt" is deleted from the sandbox
    And the git sandbox is committed
    Then the git commit result should indicate success
    And the git commit result should have 1 deleted files
    And the git file "existing.txt" should not exist in the original

  Scenario: Commit with a message stores it in metadata
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-msg"
    And a git file "new.txt" is created in the sandbox with content "data"
    And the git sandbox is committed with message "snapshot before deploy"
    Then the git commit result should indicate success
    And the git commit metadata should contain message "snapshot before deploy"
    And the git original HEAD commit message should be "snapshot before deploy"

  Scenario: Commit keeps the user's uncommitted work in the original
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And a git file "new_file.txt" is created in the sandbox with content "hello world"
    And the git user has an untracked file "note.txt" and an unstaged edit of "other.txt"
    And the git sandbox is committed
    Then the git commit result should indicate success
    And the git file "note.txt" in the original should have content "mine"
    And the git file "other.txt" in the original should have content "user edit"
    And the git original status should list only the user's work

  Scenario: Conflicting commit leaves the original untouched and the sandbox active
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git existing file "existing.txt" is modified in the sandbox with content "sandbox"
    And the git original commits "existing.txt" with content "main"
    And the git sandbox commit is attempted
    Then a git SandboxCommitError should be raised naming conflict "existing.txt"
    And the git original HEAD should be unchanged since the conflict
    And the git original should have no merge in progress
    And the git file "existing.txt" in the original should have content "main"
    And the git sandbox should be in the "active" state
    When the git sandbox commit is attempted
    Then a git SandboxCommitError should be raised naming conflict "existing.txt"

  Scenario: Commit on a cleaned-up sandbox raises SandboxStateError
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git sandbox is cleaned up
    And the git sandbox commit is attempted on cleaned-up sandbox
    Then a git SandboxStateError should be raised

  Scenario: Commit wraps a git failure into SandboxCommitError
    Given a git test repository is initialised
    And a git sandbox is created and activated for plan "plan-commiterr"
    And git add is made to fail
    When the git sandbox commit is attempted
    Then a git SandboxCommitError should be raised
    And the git sandbox should be in the "errored" state

  # --- Rollback ---

  Scenario: Rollback restores the sandbox to original state
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And a git file "temp.txt" is created in the sandbox with content "temporary"
    And the git existing file "existing.txt" is modified in the sandbox with content "changed"
    And the git sandbox is rolled back
    Then the git sandbox should be in the "rolled_back" state
    And the git file "temp.txt" should not exist in the sandbox
    And the git file "existing.txt" in the sandbox should have content "original content"

  Scenario: Rollback on a non-active sandbox raises SandboxStateError
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git sandbox rollback is attempted on created sandbox
    Then a git SandboxStateError should be raised

  Scenario: Rollback from COMMITTED restores the original branch
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-rb-committed"
    And a git file "changed.txt" is created in the sandbox with content "modified"
    And the git sandbox is committed
    Then the git sandbox should be in the "committed" state
    When the git sandbox is rolled back
    Then the git sandbox should be in the "rolled_back" state
    And the git original branch should point at the pre-commit tag
    And the git original file "existing.txt" should contain "original content"
    And the git file "changed.txt" should not exist in the original
    And the git file "changed.txt" should not exist in the sandbox

  Scenario: Rollback from COMMITTED with no changes is a no-op
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-rb-noop"
    And the git sandbox is committed
    Then the git sandbox should be in the "committed" state
    When the git sandbox is rolled back
    Then the git sandbox should be in the "rolled_back" state
    And the git original file "existing.txt" should contain "original content"

  Scenario: Rollback from COMMITTED is refused once the branch moved on
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-rb-moved"
    And a git file "changed.txt" is created in the sandbox with content "modified"
    And the git sandbox is committed
    And the git original commits "later.txt" with content "later"
    And the git sandbox rollback is attempted
    Then a git SandboxRollbackError should be raised with message "moved from"
    And the git file "changed.txt" should exist in the original with content "modified"

  # --- Checkpoints ---

  Scenario: A checkpoint restores the worktree to its state
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-ckpt"
    And a git file "a.txt" is created in the sandbox with content "first"
    And a git checkpoint "cp1" is created
    And a git file "a.txt" is created in the sandbox with content "second"
    And a git file "b.txt" is created in the sandbox with content "later"
    And the git checkpoint "cp1" is restored
    Then the git file "a.txt" in the sandbox should have content "first"
    And the git file "b.txt" should not exist in the sandbox
    And the git tag for checkpoint "cp1" should exist

  # --- Cleanup ---

  Scenario: Cleanup removes the worktree, the branch and the tags
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And a git checkpoint "cp1" is created
    And the git sandbox is cleaned up
    Then the git sandbox should be in the "cleaned_up" state
    And the git sandbox worktree should not exist
    And the git repository should list 1 worktrees
    And the git repository should have only the branch "main"
    And the git repository should have no sandbox tags

  Scenario: Cleanup is idempotent
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And the git sandbox is cleaned up
    And the git sandbox is cleaned up again
    Then the git sandbox should be in the "cleaned_up" state

  # --- Protocol properties ---

  Scenario: Git sandbox has a unique ULID identifier
    Given a git test repository is initialised
    When a git sandbox is instantiated
    Then the git sandbox_id should be a valid ULID
    And the git sandbox status should be "pending"
    And the git sandbox context should be None
    And the git sandbox should be rollbackable

  # --- Status transitions ---

  Scenario: Status transitions follow protocol
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    Then the git sandbox should be in the "created" state
    When the git path "existing.txt" is resolved
    Then the git sandbox should be in the "active" state
    When the git sandbox is committed
    Then the git sandbox should be in the "committed" state
    When the git sandbox is cleaned up
    Then the git sandbox should be in the "cleaned_up" state

  # --- The repository is the user's (issue 7; cases 27, 29) ---

  Scenario Outline: The repository's hooks never run
    Given a git test repository is initialised
    And the git repository has a "<hook>" hook that leaves a marker
    When a git sandbox is created for plan "plan-001"
    And a git file "new.txt" is created in the sandbox with content "new"
    And the git sandbox is committed
    And the git sandbox is rolled back
    And the git sandbox is cleaned up
    Then the git hook marker should not exist
    And the git file "generated.txt" should not exist in the original

    Examples:
      | hook                  |
      | post-checkout         |
      | reference-transaction |
      | post-index-change     |

  Scenario: A touched original is not a conflict
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And a git file "existing.txt" is created in the sandbox with content "sandbox"
    And the git original file "existing.txt" is touched a second later
    And the git sandbox is committed
    Then the git file "existing.txt" in the original should have content "sandbox"
    And the git original working tree should be clean

  Scenario: A leftover index lock refuses the commit and keeps the sandbox active
    Given a git test repository is initialised
    When a git sandbox is created for plan "plan-001"
    And a git file "existing.txt" is created in the sandbox with content "sandbox"
    And a git lock file "index.lock" is left in the original
    And the git sandbox commit is attempted
    Then a git SandboxCommitLockedError should be raised
    And the git sandbox should be in the "active" state
    And the git file "existing.txt" in the original should have content "original content"
