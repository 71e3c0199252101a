Feature: Sandbox status transitions
  As the sandbox lifecycle
  I want every status change checked against one state machine (seed 002, "Lifecycle")
  So that no sandbox ever reaches a state its history cannot explain

  Scenario Outline: An allowed transition is accepted
    Given a sandbox status "<current>"
    When the transition to "<target>" is checked
    Then the transition should be allowed
    And asserting the transition should not raise

    Examples:
      | current     | target      |
      | pending     | created     |
      | pending     | errored     |
      | pending     | cleaned_up  |
      | created     | active      |
      | created     | errored     |
      | created     | cleaned_up  |
      | active      | committed   |
      | active      | rolled_back |
      | active      | errored     |
      | active      | cleaned_up  |
      | committed   | cleaned_up  |
      | committed   | rolled_back |
      | committed   | errored     |
      | rolled_back | active      |
      | rolled_back | cleaned_up  |
      | rolled_back | errored     |
      | errored     | cleaned_up  |

  Scenario Outline: A refused transition raises SandboxStateError
    Given a sandbox status "<current>"
    When the transition to "<target>" is checked
    Then the transition should be refused
    And asserting the transition should raise SandboxStateError naming "<current>" and "<target>"

    Examples:
      | current     | target      |
      | pending     | active      |
      | pending     | committed   |
      | pending     | rolled_back |
      | created     | committed   |
      | created     | rolled_back |
      | created     | pending     |
      | active      | pending     |
      | active      | created     |
      | committed   | active      |
      | committed   | committed   |
      | rolled_back | committed   |
      | errored     | active      |
      | errored     | created     |
      | errored     | committed   |
      | cleaned_up  | active      |
      | cleaned_up  | created     |
      | cleaned_up  | pending     |

  Scenario: Cleaned up is the only status with no way out
    Then only "cleaned_up" should have no outgoing transitions

  Scenario: The manager treats committed, rolled back and errored sandboxes as finished
    Then the terminal statuses should be "committed, rolled_back, errored"

  Scenario: Every status can be cleaned up except cleaned up itself
    Then every status other than "cleaned_up" should be able to reach "cleaned_up"

  Scenario: A real sandbox refuses to commit twice
    Given a created "none" sandbox for plan "plan-s1"
    When the sandbox is committed
    And the sandbox is committed again
    Then a SandboxStateError should be raised naming status "committed"
    And the sandbox status should be "committed"

  Scenario Outline: Each lifecycle guard is asked of the status, in one place
    Given a sandbox status "<status>"
    Then the guards should say commit "<commit>", open "<open>", activate "<activate>", blocks plan "<blocks>"

    Examples:
      | status      | commit | open | activate | blocks |
      | pending     | no     | no   | no       | no     |
      | created     | yes    | yes  | yes      | no     |
      | active      | yes    | yes  | no       | no     |
      | committed   | no     | no   | no       | no     |
      | rolled_back | no     | yes  | yes      | yes    |
      | errored     | no     | no   | no       | yes    |
      | cleaned_up  | no     | no   | no       | no     |

  Scenario: Only git_worktree, copy_on_write and overlay can be rolled back from committed
    Then the rollbackable strategies should be "copy_on_write, git_worktree, overlay"
    And every strategy class should agree with the factory on being rollbackable

  Scenario: A failed rollback from committed leaves the sandbox committed, so it can be retried
    Given a committed "copy_on_write" sandbox whose undo fails once
    When the sandbox is rolled back expecting a failure
    Then the sandbox status should be "committed"
    When the sandbox is rolled back
    Then the sandbox status should be "rolled_back"
    And the original should hold its content from before the commit
