Feature: Copy-on-write directory sandbox lifecycle
  As a developer
  I want a sandbox that isolates plan changes in a full copy of a directory
  So that changes can be reviewed, rolled back, or committed back with renames

  # --- Creation ---

  Scenario: Create a copy-on-write sandbox
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    Then the cow sandbox should be in the "created" state
    And the cow sandbox context should reference plan "plan-001"
    And the cow sandbox context should have strategy metadata "copy_on_write"
    And the cow sandbox tree should equal the original directory

  Scenario: Creating a cow sandbox with empty plan_id raises ValueError
    Given a cow test directory is initialised
    When a cow sandbox is created with empty plan_id
    Then a cow ValueError should be raised with message "plan_id cannot be empty"

  Scenario: Creating a cow sandbox with empty resource_id raises ValueError
    Given a cow test directory is initialised
    When a cow sandbox is prepared with empty resource_id
    Then a cow ValueError should be raised with message "resource_id cannot be empty"

  Scenario: Creating a cow sandbox with empty original_path raises ValueError
    Given a cow test directory is initialised
    When a cow sandbox is prepared with empty original_path
    Then a cow ValueError should be raised with message "original_path cannot be empty"

  Scenario: Creating a cow sandbox on a non-existent directory raises SandboxCreationError
    Given a cow test directory is initialised
    When a cow sandbox is created on "missing" for plan "plan-001"
    Then a cow SandboxCreationError should be raised with message "original path does not exist"
    And the cow sandbox should be in the "errored" state

  Scenario: Creating a cow sandbox on a regular file raises SandboxCreationError
    Given a cow test directory is initialised
    When a cow sandbox is created on "existing.txt" for plan "plan-001"
    Then a cow SandboxCreationError should be raised with message "original path is not a directory"

  Scenario: Creating a cow sandbox whose root lies inside the original is refused
    Given a cow test directory is initialised
    When a cow sandbox rooted inside the original is created for plan "plan-001"
    Then a cow SandboxCreationError should be raised with message "is inside the original"

  # --- Directory structure ---

  Scenario: Cow sandbox creates its tree and manifest under the sandbox root
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    Then the cow sandbox should have a tree and a manifest under "cow/<sandbox_id>"

  # --- Path resolution ---

  Scenario: Resolve a path in the cow tree
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow path "data/file.txt" is resolved
    Then the cow resolved path should be inside the tree
    And the cow sandbox should be in the "active" state

  Scenario Outline: Path traversal is rejected
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow path "<path>" is resolved
    Then a cow ValueError should be raised with message "Path traversal not allowed"

    Examples:
      | path             |
      | ../etc/passwd    |
      | data/../../x     |
      | /etc/passwd      |
      | outside/secret   |

  Scenario: Resolving a path on a cleaned-up sandbox raises SandboxStateError
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow sandbox is cleaned up
    And the cow path "file.txt" is resolved
    Then a cow SandboxStateError should be raised

  # --- Commit ---

  Scenario: Commit with no changes produces empty result
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow sandbox is committed
    Then the cow commit result should indicate success
    And the cow commit result should list changed "", added "", deleted ""

  Scenario: Commit with a new file syncs it to original
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And a cow file "new_file.txt" is created in the sandbox with content "hello world"
    And the cow sandbox is committed
    Then the cow commit result should list changed "", added "new_file.txt", deleted ""
    And the cow original file "new_file.txt" should contain "hello world"

  Scenario: Commit with a modified file syncs the change
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And a cow file "existing.txt" is created in the sandbox with content "updated"
    And the cow sandbox is committed
    Then the cow commit result should list changed "existing.txt", added "", deleted ""
    And the cow original file "existing.txt" should contain "updated"

  Scenario: Commit with a deleted file removes it from original
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow path "existing.txt" is deleted from the sandbox
    And the cow sandbox is committed
    Then the cow commit result should list changed "", added "", deleted "existing.txt"
    And the cow original path "existing.txt" should not exist

  Scenario: Commit with a new nested directory lists every new path
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And a cow file "pkg/sub/mod.py" is created in the sandbox with content "x = 1"
    And the cow sandbox is committed
    Then the cow commit result should list changed "", added "pkg,pkg/sub,pkg/sub/mod.py", deleted ""
    And the cow original file "pkg/sub/mod.py" should contain "x = 1"

  Scenario: Commit applies a directory replaced by a file
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow path "data" is deleted from the sandbox
    And a cow file "data" is created in the sandbox with content "now a file"
    And the cow sandbox is committed
    Then the cow commit result should list changed "data", added "", deleted "data/file.txt"
    And the cow original file "data" should contain "now a file"

  Scenario: Commit applies a file replaced by a directory
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow path "existing.txt" is deleted from the sandbox
    And a cow file "existing.txt/child.txt" is created in the sandbox with content "child"
    And the cow sandbox is committed
    Then the cow commit result should list changed "existing.txt", added "existing.txt/child.txt", deleted ""
    And the cow original file "existing.txt/child.txt" should contain "child"

  Scenario: Commit applies a retargeted symlink as a link
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow symlink "link" in the sandbox is pointed at "existing.txt"
    And the cow sandbox is committed
    Then the cow commit result should list changed "link", added "", deleted ""
    And the cow original symlink "link" should point at "existing.txt"

  Scenario: Commit applies a mode change
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow path "existing.txt" in the sandbox gets mode "755"
    And the cow sandbox is committed
    Then the cow commit result should list changed "existing.txt", added "", deleted ""
    And the cow original path "existing.txt" should have mode "755"

  Scenario: Commit with a message stores it in metadata
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-msg"
    And a cow file "new.txt" is created in the sandbox with content "data"
    And the cow sandbox is committed with message "snapshot before deploy"
    Then the cow commit result should indicate success
    And the cow commit metadata should contain message "snapshot before deploy"

  Scenario: Commit refuses a path changed in both the sandbox and the original
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And a cow file "existing.txt" is created in the sandbox with content "sandbox"
    And the cow original file "existing.txt" is changed to "original moved on"
    And the cow sandbox commit is attempted
    Then a cow SandboxCommitError should be raised with conflicts "existing.txt"
    And the cow sandbox should be in the "active" state
    And the cow original file "existing.txt" should contain "original moved on"

  Scenario: Commit on a cleaned-up sandbox raises SandboxStateError
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow sandbox is cleaned up
    And the cow sandbox commit is attempted
    Then a cow SandboxStateError should be raised

  # --- Rollback ---

  Scenario: Rollback restores the sandbox to original state
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And a cow file "temp.txt" is created in the sandbox with content "temporary"
    And the cow sandbox is rolled back
    Then the cow sandbox should be in the "rolled_back" state
    And the cow sandbox path "temp.txt" should not exist
    And the cow sandbox tree should equal the original directory

  Scenario: Rollback on a created sandbox raises SandboxStateError
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow sandbox rollback is attempted
    Then a cow SandboxStateError should be raised

  Scenario: A rolled-back sandbox can be used again
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And a cow file "temp.txt" is created in the sandbox with content "temporary"
    And the cow sandbox is rolled back
    And the cow path "again.txt" is resolved
    Then the cow sandbox should be in the "active" state

  Scenario: Rollback from COMMITTED restores the original and resets the tree
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-rb-committed"
    And a cow file "changed.txt" is created in the sandbox with content "modified"
    And a cow file "existing.txt" is created in the sandbox with content "modified"
    And the cow path "data" is deleted from the sandbox
    And the cow sandbox is committed
    Then the cow sandbox should be in the "committed" state
    When the cow sandbox is rolled back
    Then the cow sandbox should be in the "rolled_back" state
    And the cow original should be exactly as initialised
    And the cow sandbox path "changed.txt" should not exist

  Scenario: Rollback from COMMITTED with no changes is a no-op
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-rb-noop"
    And the cow sandbox is committed
    And the cow sandbox is rolled back
    Then the cow sandbox should be in the "rolled_back" state
    And the cow original should be exactly as initialised

  # --- Cleanup ---

  Scenario: Cleanup removes the sandbox directory and never the original
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow sandbox is cleaned up
    Then the cow sandbox should be in the "cleaned_up" state
    And the cow sandbox base path should not exist
    And the cow original should be exactly as initialised

  Scenario: Cleanup is idempotent
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And the cow sandbox is cleaned up
    And the cow sandbox is cleaned up
    Then the cow sandbox should be in the "cleaned_up" state

  Scenario: Cleanup after commit keeps the committed original
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    And a cow file "new_file.txt" is created in the sandbox with content "kept"
    And the cow sandbox is committed
    And the cow sandbox is cleaned up
    Then the cow sandbox base path should not exist
    And the cow original file "new_file.txt" should contain "kept"

  # --- Protocol properties ---

  Scenario: Cow sandbox has a unique ULID identifier
    Given a cow test directory is initialised
    When a cow sandbox is instantiated
    Then the cow sandbox_id should be a valid ULID
    And the cow sandbox status should be "pending"
    And the cow sandbox context should be None
    And the cow sandbox should satisfy the Sandbox protocol and be rollbackable

  # --- Status transitions ---

  Scenario: Status transitions follow protocol
    Given a cow test directory is initialised
    When a cow sandbox is created for plan "plan-001"
    Then the cow sandbox should be in the "created" state
    When the cow path "existing.txt" is resolved
    Then the cow sandbox should be in the "active" state
    When the cow sandbox is committed
    Then the cow sandbox should be in the "committed" state
    When the cow sandbox is cleaned up
    Then the cow sandbox should be in the "cleaned_up" state

  # --- Error wrapping ---

  Scenario: Commit wraps OSError into SandboxCommitError
    Given a cow test directory is initialised
    And a cow sandbox is created and activated for plan "plan-commiterr"
    And a cow file "existing.txt" is created in the sandbox with content "updated"
    And cow "sandbox_core.tree.copy.copy_file" is patched to raise OSError
    When the cow sandbox commit is attempted
    Then a cow SandboxCommitError should be raised
    And the cow sandbox should be in the "errored" state
    And the cow original should be exactly as initialised

  Scenario: Rollback wraps OSError into SandboxRollbackError
    Given a cow test directory is initialised
    And a cow sandbox is created and activated for plan "plan-rberr"
    And the cow path "existing.txt" is deleted from the sandbox
    And cow "sandbox_core.tree.copy.copy_file" is patched to raise OSError
    When the cow sandbox rollback is attempted
    Then a cow SandboxRollbackError should be raised
    And the cow sandbox should be in the "errored" state

  Scenario: Create wraps OSError into SandboxCreationError
    Given a cow test directory is initialised
    And cow "sandbox_core.tree.baseline.backup_directory" is patched to raise OSError
    When a cow sandbox is created for plan "plan-createerr"
    Then a cow SandboxCreationError should be raised with message "injected"
    And the cow sandbox should be in the "errored" state
    And the cow sandbox base path should not exist
